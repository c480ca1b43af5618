"""Overload: the queue bound holds exactly, and a refusal is a matter of milliseconds."""

from __future__ import annotations

import asyncio
import statistics
import time

import httpx
import pytest
from redis.asyncio import Redis

from llmq.protocol import keys
from tests.support.servers import StartApi, StartWorker
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(30)

#: What a 429 costs beyond a lookup of an unknown request (a 404 after one Redis round
#: trip, as the 429's queue check is one), median of pairs sent one after the other.
#: docs/architecture.md says "within milliseconds". Each pair meets the same machine
#: and the same Redis, so a loaded one slows both alike; the bound is its margin, short
#: of the 0.1 s more a 429 held back would cost. The 429's own latency is the overload
#: benchmark's figure (bench/scenarios/overload.py).
MAX_429_EXTRA_SECONDS = 0.08


async def post(client: httpx.AsyncClient, i: int) -> tuple[int, float]:
    body = {"model": "mock", "prompt": f"b{i}", "max_tokens": 100}
    started = time.perf_counter()
    r = await client.post("/v1/completions", json=body)
    return r.status_code, time.perf_counter() - started


async def look_up(client: httpx.AsyncClient, i: int) -> tuple[int, float]:
    started = time.perf_counter()
    r = await client.get(f"/v1/requests/unknown-{i}")
    return r.status_code, time.perf_counter() - started


async def test_a_burst_is_admitted_up_to_the_bound_and_the_rest_refused_in_milliseconds(
    start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    """2 slots + a queue of 3: of a burst of 30 long requests, exactly 5 are
    accepted (none finishes during the burst); the others get 429 at once: a 429
    costs hardly more than a lookup in Redis."""
    # slow tokens: none finishes during the test, and the relay adds little to the loop
    await start_worker(concurrency=2, model_tokens_per_second=10)
    api = await start_api(max_queue_depth=3)
    async with api.client() as client:
        burst = [asyncio.create_task(post(client, i)) for i in range(30)]
        try:
            refused: list[asyncio.Task[tuple[int, float]]] = []
            in_redis = 0

            async def all_answered_or_admitted() -> bool:
                nonlocal in_redis
                refused[:] = [task for task in burst if task.done()]
                # both counts at one instant: a claim moves a request from one to the
                # other between two separate reads, and it would be counted twice
                async with redis.pipeline(transaction=True) as pipe:
                    pipe.zcard(keys.queue("mock"))
                    pipe.zcard(keys.running("mock"))
                    queued, running = await pipe.execute()
                in_redis = int(queued) + int(running)
                return len(refused) + in_redis >= 30

            await wait_until(all_answered_or_admitted, timeout=10, what="30 answers or admissions")
            # one at a time, with the queue full: each refusal on its own, each after
            # a lookup of an unknown request
            pairs = [(await look_up(client, i), await post(client, 100 + i)) for i in range(20)]
        finally:
            for task in burst:
                task.cancel()
            await asyncio.gather(*burst, return_exceptions=True)
    assert [(lookup[0], full[0]) for lookup, full in pairs] == [(404, 429)] * 20
    extra = statistics.median(full[1] - lookup[1] for lookup, full in pairs)
    assert extra < MAX_429_EXTRA_SECONDS, extra
    assert in_redis == 5
    assert [task.result()[0] for task in refused] == [429] * 25
