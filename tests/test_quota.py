"""A tenant's quota: taken atomically by every API process, returned when a request
ends (also when its API process dies), and OpenAI's 429 when it is spent."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from api.admission.flow import duration
from llmq.connection import connect
from llmq.embedded import EmbeddedRedis, free_port
from llmq.protocol import keys
from llmq.protocol.queue import Queue
from llmq.protocol.quota import Limits, Quota, Verdict, parse_take, take_slots
from llmq.protocol.scripts import scripts_for
from llmq.settings import CommonSettings
from llmq.tenants import Tenant, TenantStore
from tests.support.cluster import BOTH_BACKENDS
from tests.support.jobs import enqueue_call
from tests.support.native import wait_ready
from tests.support.processes import Proc, children_of, clean_env, llmq, reap
from tests.support.servers import StartApi, StartWorker
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

HOLD_MS = 60_000


async def take(
    redis: Redis, limits: Limits, hold_ms: int, reservations: list[tuple[str, int]]
) -> Verdict:
    """Tenant ``acme``'s take for ``reservations`` (id, tokens), the script alone."""
    slots = take_slots("acme", limits, hold_ms, reservations)
    return parse_take(await slots.run(scripts_for(redis)))


async def level(redis: Redis, key: str) -> float:
    found = await redis.hget(key, "level")  # type: ignore[misc]
    return float(found)


async def test_a_take_is_all_or_none_and_a_return_counts_once(redis: Redis) -> None:
    quota = Quota(redis)
    limits = Limits(tokens_per_minute=6000, requests_per_minute=600)  # bursts 600 and 60
    tpm_key, _, inflight, reserved = keys.quota_keys("acme")
    first = await take(redis, limits, HOLD_MS, [("a", 700)])  # more than the burst
    assert first.taken and first.remaining_tokens == 0
    assert first.limit_tokens == 6000 and first.limit_requests == 600
    assert first.remaining_requests == 59
    again = await take(redis, limits, HOLD_MS, [("a", 700)])  # a pipeline run twice
    assert again.taken and again.remaining_requests == 59  # nothing taken twice
    assert -100 <= await level(redis, tpm_key) < 0  # 700 of a burst of 600, once
    too_many = await take(redis, limits, HOLD_MS, [("b", 300), ("c", 300)])
    assert not too_many.taken and too_many.which == "tokens"
    assert 500 < too_many.retry_ms <= 1100  # a debt of 100 tokens at 100 a second
    assert await redis.zrange(inflight, 0, -1) == ["a"]  # none of b, c
    assert await quota.give_back("acme", "a", 100) == 600  # used 100 of 700
    assert await quota.give_back("acme", "a", 0) == 0  # only the first return counts
    assert await level(redis, tpm_key) >= 450
    assert await redis.zcard(inflight) == 0 and await redis.hlen(reserved) == 0  # type: ignore[misc]
    assert (await take(redis, limits, HOLD_MS, [("b", 300), ("c", 300)])).taken
    at_once = Limits(max_concurrent=3)
    third = await take(redis, at_once, HOLD_MS, [("d", 10), ("e", 10)])
    assert not third.taken and third.which == "concurrent"


async def test_a_place_whose_request_was_never_returned_lapses(redis: Redis) -> None:
    limits = Limits(max_concurrent=1)
    assert (await take(redis, limits, 50, [("lost", 1)])).taken  # nobody returns it
    assert not (await take(redis, limits, HOLD_MS, [("next", 1)])).taken

    async def taken() -> bool:
        return (await take(redis, limits, HOLD_MS, [("next", 1)])).taken

    await wait_until(taken, timeout=10, what="the lapsed place taken again")


@BOTH_BACKENDS
@pytest.mark.parametrize("n", [1, 3])
async def test_a_request_is_queued_only_with_its_quota_taken(
    backend: str, redis_url: str, redis: Redis, n: int
) -> None:
    """Admission takes the quota with the requests' records (on a single Redis a lone
    request's enqueue rides in the same round trip, and ``enqueue.lua`` checks the
    reservation): a refused take queues nothing and leaves no record behind."""
    client = connect(CommonSettings(redis_url=redis_url))
    try:
        queue = Queue(client, stream_maxlen=1000, ttl_seconds=60)
        limits = Limits(max_concurrent=n)

        def take_for(ids: list[str]) -> Any:
            return take_slots("acme", limits, HOLD_MS, [(i, 10) for i in ids])

        first = [enqueue_call(f"a{i}") for i in range(n)]
        admitted = await queue.admit(first, 10, quota=take_for([c.request_id for c in first]))
        assert admitted.queued and admitted.quota is not None and admitted.quota.taken
        late = [enqueue_call(f"b{i}") for i in range(n)]
        refused = await queue.admit(late, 10, quota=take_for([c.request_id for c in late]))
        assert not refused.queued and refused.quota is not None
        assert not refused.quota.taken and refused.quota.which == "concurrent"
        queued = await redis.zrange(keys.queue("mock"), 0, -1)
        assert sorted(queued) == sorted(c.request_id for c in first)
        for c in late:  # no record, note or job of a refused request
            assert not await redis.exists(keys.request(c.request_id), keys.lifecycle(c.request_id))
            assert not await redis.exists(keys.job(c.request_id, "mock"))
        _, _, inflight, reserved = keys.quota_keys("acme")
        assert await redis.zcard(inflight) == n and await redis.hlen(reserved) == n  # type: ignore[misc]
    finally:
        await (
            client.aclose() if backend == "cluster" else client.aclose(close_connection_pool=True)
        )


def test_durations_read_as_openai_writes_them() -> None:
    assert [duration(x) for x in (12, 1500, 60_000, 360_000, 61_250)] == [
        "12ms",
        "1.5s",
        "1m0s",
        "6m0s",
        "1m1.25s",
    ]


async def test_over_the_limit_is_openais_429(
    start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    await TenantStore(redis).put(Tenant(name="default", requests_per_minute=2))
    await start_worker()
    api = await start_api()
    body = {"model": "mock", "prompt": "hi", "max_tokens": 2}
    async with api.client() as client:
        await wait_ready(client)
        # wait_ready sent none: the bucket holds its burst, one request (of 2 a minute)
        answers = [await client.post("/v1/completions", json=body) for _ in range(2)]
        streamed = await client.post("/v1/completions", json={**body, "stream": True})
    assert answers[0].status_code == 200
    ok = answers[0].headers  # an accepted request says what is left too
    assert ok["x-ratelimit-limit-requests"] == "2" and ok["x-ratelimit-remaining-requests"] == "0"
    assert streamed.status_code == 429  # a stream is refused before it starts
    refused = answers[1]
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["code"] == "rate_limit_exceeded" and error["type"] == "rate_limit_error"
    assert "2 requests per minute" in error["message"]
    h = refused.headers
    assert h["x-ratelimit-limit-requests"] == "2"
    assert h["x-ratelimit-remaining-requests"] == "0"
    assert h["x-ratelimit-reset-requests"].endswith("s")
    assert 1 <= int(h["retry-after"]) <= 31 and h["x-should-retry"] == "true"
    assert "x-ratelimit-limit-tokens" not in h  # no token limit

    async def counted() -> bool:
        async with api.client() as client:
            text = (await client.get("/metrics")).text
        return 'llmq_tenant_requests_total{outcome="rate_limited",tenant="default"} 2.0' in text

    await wait_until(counted, timeout=10, what="the refusal in /metrics")
    code, out, _ = await llmq(api.settings.redis_url, "tenant", "stats")
    row = next(line.split() for line in out.splitlines() if line.startswith("default "))
    assert code == 0 and row[-3:] == ["1", "2", "0"]  # accepted, rate limited, shed
    assert int(row[3]) > 0  # tokens of the requests that ended


async def test_unused_tokens_come_back_when_a_request_ends(
    start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    await TenantStore(redis).put(Tenant(name="default", tokens_per_minute=1000))
    await start_worker()
    api = await start_api()
    body = {"model": "mock", "prompt": "hi", "max_tokens": 900, "stop": ["a", "e", "o"]}
    async with api.client(timeout=30) as client:
        await wait_ready(client)
        first = await client.post("/v1/completions", json=body)
        assert first.status_code == 200
        used = first.json()["usage"]["total_tokens"]
        assert used < 200  # stopped early: most of its 901 tokens are unused
        reserved = keys.quota_keys("default")[3]

        async def returned() -> bool:  # by the worker, once it finished the request
            return int(await redis.hlen(reserved)) == 0  # type: ignore[misc]

        await wait_until(returned, timeout=10, what="the reservation returned")
        # Without the return, the debt of 800 tokens would take the bucket 48 s to repay.
        second = await client.post("/v1/completions", json=body)
    assert second.status_code == 200
    too_big = {**body, "max_tokens": 1000}
    async with api.client() as client:
        refused = await client.post("/v1/completions", json=too_big)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "tokens_over_limit"


async def test_processes_share_one_quota(
    redis_url: str, redis: Redis, start_worker: StartWorker
) -> None:
    await TenantStore(redis).put(Tenant(name="default", requests_per_minute=60))  # burst 6
    await start_worker()
    port = free_port()
    env = clean_env(LLMQ_REDIS_URL=redis_url, LLMQ_PORT=str(port))
    api = Proc(["api", "--api-processes", "2"], env)
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            await wait_ready(client, timeout=30)
        t0 = time.monotonic()

        async def one(i: int) -> int:
            async with httpx.AsyncClient(base_url=url, timeout=30) as own:  # its own connection
                body = {"model": "mock", "prompt": f"p{i}", "max_tokens": 1}
                return (await own.post("/v1/requests", json=body)).status_code

        codes = await asyncio.gather(*(one(i) for i in range(20)))
        refill = int(60 * (time.monotonic() - t0) / 60)  # one a second
        assert 6 <= codes.count(202) <= 6 + refill, codes
        assert codes.count(429) == 20 - codes.count(202)
    finally:
        api.stop()
        reap(children_of(api.pid))


async def test_a_killed_api_process_leaks_no_places(
    redis_url: str, redis: Redis, start_worker: StartWorker, start_api: StartApi
) -> None:
    await TenantStore(redis).put(Tenant(name="default", max_concurrent=2))
    await start_worker(model_tokens_per_second=20)
    port = free_port()
    env = clean_env(LLMQ_REDIS_URL=redis_url, LLMQ_PORT=str(port), LLMQ_ORPHAN_GRACE_SECONDS="2")
    api = Proc(["api"], env)
    url = f"http://127.0.0.1:{port}"
    inflight = keys.quota_keys("default")[2]
    body = {"model": "mock", "prompt": "long", "max_tokens": 2000, "stream": True}
    try:
        async with (
            httpx.AsyncClient(base_url=url, timeout=30) as client,
            contextlib.AsyncExitStack() as streams,
        ):
            await wait_ready(client, timeout=30)
            for _ in range(2):
                opened = client.stream("POST", "/v1/completions", json=body)
                assert (await streams.enter_async_context(opened)).status_code == 200
            assert await redis.zcard(inflight) == 2
            os.kill(api.pid, signal.SIGKILL)
    finally:
        api.stop()
    other = await start_api()

    async def returned() -> bool:
        return int(await redis.zcard(inflight)) == 0

    await wait_until(returned, timeout=30, what="the dead process's places returned")
    async with other.client() as client:
        accepted = await client.post("/v1/requests", json={**body, "stream": False})
    assert accepted.status_code == 202


async def test_quotas_hold_across_a_redis_restart(
    own_redis: EmbeddedRedis, start_api: StartApi
) -> None:
    redis = Redis.from_url(own_redis.url, decode_responses=True)
    await TenantStore(redis).put(Tenant(name="default", requests_per_minute=2))
    await redis.aclose()
    api = await start_api(redis_url=own_redis.url, accept_models="mock", relay_block_ms=500)
    body = {"model": "mock", "prompt": "hi", "max_tokens": 2}
    async with api.client(timeout=10) as client:
        assert (await client.post("/v1/requests", json=body)).status_code == 202
        own_redis.stop(remove=False)  # a restart: AOF kept the bucket and the tenant
        own_redis.start()

        answers: list[int] = []

        async def answered() -> bool:  # 503 while Redis is away: nothing taken
            answers.append((await client.post("/v1/requests", json=body)).status_code)
            return answers[-1] != 503

        await wait_until(answered, timeout=20, what="the API back on Redis")
    assert answers[-1] == 429  # the spent bucket survived (one request each 30 s)
