"""An exhausted Redis pool is overload (429 ``server_busy``), not an outage; pools are sized
from the process's concurrency."""

from __future__ import annotations

import time

import pytest
from redis.asyncio import Redis

from llmq.connection import DEFAULT_POOL_SIZE, WORKER_POOL_HEADROOM, pool_size
from llmq.protocol import keys
from llmq.settings import ApiSettings, WorkerSettings
from tests.support.native import wait_ready
from tests.support.servers import StartApi, StartWorker

POOL_TIMEOUT = 0.3


async def test_exhausted_pool_answers_429_not_503(
    start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    await start_worker()
    api = await start_api(redis_max_connections=1, redis_pool_timeout_seconds=POOL_TIMEOUT)
    body = {"model": "mock", "prompt": "x", "max_tokens": 2}
    async with api.client() as client:
        await wait_ready(client)
        pool = api.app_state().redis.connection_pool
        held = await pool.get_connection()  # the pool's only connection: it is exhausted
        try:
            before = await redis.dbsize()
            started = time.monotonic()
            busy = await client.post("/v1/completions", json=body)
            took = time.monotonic() - started
            after_refusal = await redis.dbsize()
        finally:
            await pool.release(held)
        served = await client.post("/v1/completions", json=body)
    assert busy.status_code == 429, busy.text
    assert busy.headers["retry-after"] == "1"
    assert busy.json()["error"]["code"] == "server_busy"
    assert busy.json()["error"]["type"] == "rate_limit_error"
    # It waited for a connection for the bound, then answered (the upper bound is only a
    # loaded machine's margin: the answer comes after the wait, not never).
    assert POOL_TIMEOUT * 0.9 <= took < POOL_TIMEOUT + 10.0
    # The refusal left nothing behind, and the process serves again once a connection frees.
    assert after_refusal == before and await redis.zcard(keys.queue("mock")) == 0
    assert served.status_code == 200 and served.json()["usage"]["completion_tokens"] == 2


def test_pool_sizes_follow_the_configured_concurrency() -> None:
    assert pool_size(ApiSettings()) == DEFAULT_POOL_SIZE
    assert pool_size(WorkerSettings(concurrency=8)) == DEFAULT_POOL_SIZE
    assert pool_size(WorkerSettings(concurrency=400)) == 400 + WORKER_POOL_HEADROOM
    assert pool_size(WorkerSettings(concurrency=400, redis_max_connections=5)) == 5
    with pytest.raises(ValueError):
        ApiSettings(redis_max_connections=-1)
