"""The load generator against llmq's own API: real SSE, 429s and dropped streams."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from redis.asyncio import Redis

from llmq.embedded import free_port
from llmq.protocol import keys
from llmq.protocol.streams import published_tokens
from loadgen import LoadConfig, run_load
from tests.support.native import wait_ready
from tests.support.processes import Proc, clean_env
from tests.support.servers import StartApi, StartWorker
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


async def test_parses_our_stream_and_counts_429s(
    start_api: StartApi, start_worker: StartWorker
) -> None:
    await start_worker(concurrency=2, model_tokens_per_second=200)
    api = await start_api(max_queue_depth=2)
    async with api.client() as client:
        await wait_ready(client)
    config = LoadConfig(
        base_url=api.url,
        endpoint="chat",
        num_requests=20,
        request_rate=float("inf"),
        prompt_tokens=(5, 5),
        output_tokens=(12, 12),
        seed=3,
    )
    result = await run_load(config)
    summary = result.summary()
    ok = [r for r in result.measurements if r.ok]
    assert summary["failures"]["http_429"] > 0
    assert summary["completed"] == len(ok) >= 2
    assert summary["completed"] + summary["failures"]["http_429"] == 20
    assert all(r.output_tokens == 12 for r in ok)  # from the usage chunk
    assert all(r.ttft_s is not None and r.ttft_s > 0 for r in ok)


async def test_a_connection_dropped_mid_stream_is_a_drop(
    start_worker: StartWorker, redis_url: str, redis: Redis
) -> None:
    """The API process is killed (SIGKILL) under three streams that have started."""
    await start_worker(concurrency=4, model_tokens_per_second=20)
    port = free_port()
    api = Proc(["api"], clean_env(LLMQ_REDIS_URL=redis_url, LLMQ_PORT=str(port)))
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            await wait_ready(client, timeout=30)
        config = LoadConfig(
            base_url=f"http://127.0.0.1:{port}",
            num_requests=3,
            request_rate=float("inf"),
            prompt_tokens=(5, 5),
            output_tokens=(200, 200),
            timeout=30,
        )
        run = asyncio.create_task(run_load(config))
        await wait_until(
            lambda: streams_with_tokens(redis, 3), timeout=20, what="three streams to start"
        )
        api.popen.kill()
        result = await run
    finally:
        api.stop()
    failures = result.summary()["failures"]
    assert (failures["dropped"], failures["connection"]) == (3, 0)
    assert all(r.ttft_s is not None for r in result.measurements)  # each had seen a token


async def streams_with_tokens(redis: Redis, n: int) -> bool:
    """At least ``n`` requests have tokens in their streams (and so clients have chunks)."""
    rids = [k.split(":")[-1] for k in await redis.keys(keys.REQUESTS_GLOB)]
    counts = [len(await published_tokens(redis, rid)) for rid in rids]
    return sum(1 for c in counts if c >= 2) >= n
