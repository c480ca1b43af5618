"""Admission control, deadlines and token-aware load balancing."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from redis.asyncio import Redis

from llmq.protocol import keys
from tests.support.native import post_request, record, wait_status
from tests.support.servers import SpawnWorkers, StartApi, StartWorker
from tests.support.sse import openai_chunks
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


async def test_full_queue_gets_429_and_enqueues_nothing(
    start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    await start_worker(concurrency=1, model_tokens_per_second=50)
    api = await start_api(max_queue_depth=3)
    async with api.client() as client:
        busy = await post_request(client, "busy", max_tokens=50)
        await wait_status(client, busy, "running")
        for i in range(3):
            await post_request(client, f"q{i}", max_tokens=1)
        before = await redis.dbsize()
        r = await client.post("/v1/completions", json={"model": "mock", "prompt": "x"})
    assert r.status_code == 429
    assert r.headers["retry-after"] == "1"
    assert r.json()["error"]["code"] == "queue_full"
    assert r.json()["error"]["type"] == "rate_limit_error"
    assert await redis.dbsize() == before
    assert await redis.zcard(keys.queue("mock")) == 3


async def test_priority_and_timeouts_are_validated(stack_limits: StartApi) -> None:
    api = await stack_limits(min_priority=-2, max_priority=3, queue_timeout_seconds=5)
    async with api.client() as client:
        high = await client.post(
            "/v1/requests", json={"model": "mock", "prompt": "x", "priority": 4}
        )
        low = await client.post(
            "/v1/requests", json={"model": "mock", "prompt": "x", "priority": -3}
        )
        wait = await client.post(
            "/v1/requests", json={"model": "mock", "prompt": "x", "queue_timeout": 6}
        )
        zero = await client.post(
            "/v1/requests", json={"model": "mock", "prompt": "x", "generation_timeout": 0}
        )
    assert [r.status_code for r in (high, low, wait, zero)] == [400, 400, 400, 400]
    assert [r.json()["error"]["param"] for r in (high, low, wait, zero)] == [
        "priority",
        "priority",
        "queue_timeout",
        "generation_timeout",
    ]


@pytest.fixture
async def stack_limits(start_api: StartApi, start_worker: StartWorker) -> StartApi:
    await start_worker()
    return start_api


async def test_queue_without_workers_until_the_deadline(start_api: StartApi, redis: Redis) -> None:
    api = await start_api(accept_models="mock,other", sweep_seconds=0.05)
    async with api.client() as client:
        started = time.monotonic()
        body = {"model": "mock", "prompt": "anyone?", "stream": True, "queue_timeout": 0.5}
        async with client.stream("POST", "/v1/completions", json=body) as r:
            chunks = await openai_chunks(r)
        waited = time.monotonic() - started
        plain = await client.post(
            "/v1/chat/completions",
            json={
                "model": "other",
                "messages": [{"role": "user", "content": "hi"}],
                "queue_timeout": 0.3,
            },
        )
        unknown = await client.post("/v1/completions", json={"model": "nope", "prompt": "x"})
    assert chunks[-1]["error"]["code"] == "queue_timeout"
    assert 0.45 <= waited < 3
    assert plain.status_code == 504 and plain.json()["error"]["code"] == "queue_timeout"
    assert unknown.status_code == 503
    assert await redis.zcard(keys.queue("mock")) == 0
    assert await redis.zcard(keys.deadlines("mock")) == 0


async def test_expired_request_never_starts_on_a_late_worker(
    start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    api = await start_api(accept_models="mock", sweep_seconds=30)
    async with api.client() as client:
        rid = await post_request(client, "late", queue_timeout=0.2)
        await asyncio.sleep(0.3)  # the deadline passes while no worker exists (the point)
        await start_worker(sweep_seconds=30)
        rec = await wait_status(client, rid, "failed", timeout=10)
    assert rec["finish_reason"] == "timeout" and rec["started_at"] is None
    types = [f["type"] for _, f in await redis.xrange(keys.stream(rid))]
    assert types == ["error"]


async def test_generation_timeout(stack_limits: StartApi) -> None:
    api = await stack_limits()
    async with api.client() as client:
        body = {
            "model": "mock",
            "prompt": "go on",
            "max_tokens": 1000,
            "stream": True,
            "generation_timeout": 0.3,
            "stream_options": {"include_usage": True},
        }
        async with client.stream("POST", "/v1/completions", json=body) as r:
            chunks = await openai_chunks(r)
        non_stream = await client.post(
            "/v1/completions",
            json={"model": "mock", "prompt": "x", "max_tokens": 1000, "generation_timeout": 0.2},
        )
    closing = [c["choices"][0] for c in chunks if c.get("choices")][-1]
    assert closing["finish_reason"] == "abort" and closing["llmq_finish_reason"] == "timeout"
    error = next(c for c in chunks if "error" in c)
    assert error["error"]["code"] == "generation_timeout"
    assert 0 < chunks[-1]["usage"]["completion_tokens"] < 1000
    assert non_stream.status_code == 504


async def test_token_budget_spreads_long_requests(
    start_api: StartApi, spawn_workers: SpawnWorkers
) -> None:
    """Two long requests (cost 610 each) cannot share a worker whose budget is 1000."""
    await spawn_workers(2, concurrency=8, worker_token_budget=1000, model_tokens_per_second=100)
    api = await start_api()
    async with api.client() as client:
        long = [await post_request(client, "ten words " * 5, max_tokens=600) for _ in range(2)]
        short = [await post_request(client, "short", max_tokens=20) for _ in range(6)]
        for rid in long:
            await wait_status(client, rid, "running")
        short_records = [await wait_status(client, rid, "done") for rid in short]
        long_records = [await record(client, rid) for rid in long]
        huge = await post_request(
            client, "huge", max_tokens=1500
        )  # over budget: an idle worker takes it
        await client.delete(f"/v1/requests/{long[0]}")
        await client.delete(f"/v1/requests/{long[1]}")
        huge_record = await wait_status(client, huge, "running", "done", timeout=20)
    assert long_records[0]["worker"] != long_records[1]["worker"]
    assert all(r["status"] == "done" for r in short_records)
    assert huge_record["worker"] is not None


async def test_overload_burst(start_api: StartApi, start_worker: StartWorker, redis: Redis) -> None:
    """A burst of 10x capacity: accepted ones finish, the rest get 429 at admission (they
    never enter the queue, so nothing of theirs is left in Redis), /healthz answers
    throughout. How fast a 429 comes is measured by ``python -m bench --scenarios overload``,
    not bounded here: a loaded machine stretches any wall-clock bound."""
    await start_worker(concurrency=2, model_tokens_per_second=200)
    api = await start_api(max_queue_depth=3)
    async with api.client() as client:

        async def one(i: int) -> httpx.Response:
            return await client.post(
                "/v1/completions", json={"model": "mock", "prompt": f"b{i}", "max_tokens": 20}
            )

        burst = asyncio.gather(*(one(i) for i in range(50)))
        health = []
        while not burst.done():
            health.append((await client.get("/healthz")).status_code)
            await asyncio.sleep(0.01)
        results = await burst
    ok = [r for r in results if r.status_code == 200]
    rejected = [r for r in results if r.status_code == 429]
    assert len(ok) + len(rejected) == 50
    assert 3 <= len(ok) < 50 and rejected
    for refused in rejected:
        assert refused.json()["error"]["type"] and refused.headers["retry-after"]
    assert health and set(health) == {200}

    async def drained() -> bool:
        return int(await redis.zcard(keys.running("mock"))) == 0

    await wait_until(drained, timeout=10, what="the running set to drain")
    assert await redis.zcard(keys.queue("mock")) == 0
    # A rejected request leaves nothing of its own: a record, a stream and a fence per
    # accepted request only (lifecycle notes go to a bounded set of group streams).
    own = [k for k in await redis.keys("*") if k.split(":")[1] in ("req", "stream", "fence")]
    assert len(own) == 3 * len(ok), own
