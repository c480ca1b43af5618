"""Shedding by expected wait: a request that would wait longer than the bound is
refused at once with 429 and a Retry-After from the estimate, instead of queued."""

from __future__ import annotations

import time

import pytest
from redis.asyncio import Redis

from api.admission.flow import RATE_PERIODS
from llmq.protocol import keys
from tests.support.native import wait_ready
from tests.support.servers import StartApi, StartWorker
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

BODY = {"model": "mock", "prompt": "w", "max_tokens": 10, "ignore_eos": True}


async def measured(redis: Redis) -> int:
    """Requests finished in the periods that measure the service rate."""
    period = int(time.time()) // keys.SERVED_PERIOD_SECONDS
    names = [keys.served("mock", period - i) for i in range(RATE_PERIODS + 1)]
    return sum(int(x) for x in await redis.mget(names) if x is not None)


async def test_a_request_that_would_wait_too_long_is_refused_at_once(
    start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    await start_worker(concurrency=1, model_tokens_per_second=100)  # 0.1 s a request
    api = await start_api(shed_wait_seconds=2)
    async with api.client(timeout=30) as client:
        await wait_ready(client)
        for _ in range(5):  # a measured service rate
            assert (await client.post("/v1/completions", json=BODY)).status_code == 200

        async def rate_known() -> bool:
            return await measured(redis) > 0

        await wait_until(rate_known, timeout=20, what="finished requests counted")
        rate = await measured(redis) / (RATE_PERIODS * keys.SERVED_PERIOD_SECONDS)  # at most
        bound = 2 * rate  # requests ahead that fit in the bound
        answers = [await client.post("/v1/requests", json=BODY) for _ in range(int(bound) + 20)]
    codes = [a.status_code for a in answers]
    assert codes[0] == 202 and 429 in codes, codes
    refused = next(a for a in answers if a.status_code == 429)
    assert refused.json()["error"]["code"] == "wait_too_long"
    assert int(refused.headers["retry-after"]) >= 1
    # What was accepted fits the bound (the queue drains meanwhile: a few more pass).
    assert codes.count(202) <= bound + 10, (codes, bound)


async def test_without_a_measured_rate_nothing_is_shed(
    start_api: StartApi, start_worker: StartWorker
) -> None:
    await start_worker(concurrency=1, model_tokens_per_second=20)
    api = await start_api(shed_wait_seconds=0.001)
    async with api.client(timeout=30) as client:
        await wait_ready(client)
        codes = [(await client.post("/v1/requests", json=BODY)).status_code for _ in range(5)]
    assert codes == [202] * 5
