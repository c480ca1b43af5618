"""Hand-off: a request that finds a parked worker is claimed for it by the enqueue script."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.client import PubSub

from llmq.policy import store
from llmq.policy.live import LivePolicy
from llmq.protocol import keys
from llmq.protocol.queue import Claim, Queue, parse_handoff
from tests.support.jobs import Placed, enqueue_costing
from tests.support.native import post_request, wait_ready, wait_status
from tests.support.servers import StartApi, StartWorker
from tests.support.waiting import wait_until
from worker.queue_worker import ClaimingRedis

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def queue(redis: Redis) -> Queue:
    return Queue(redis, stream_maxlen=100, ttl_seconds=60)


@pytest.fixture
async def listener(redis: Redis) -> AsyncIterator[PubSub]:
    pubsub = redis.pubsub()
    yield pubsub
    await pubsub.aclose()  # type: ignore[no-untyped-call]


async def claim(
    queue: Queue, worker: str, free: int, budget: int | None = None, idle: bool = True
) -> Claim:
    """A claim by a live worker (its heartbeat, a renewal, comes first, as in a worker)."""
    await queue.renew("mock", {}, lease_ms=3000, worker_id=worker)
    return await queue.claim(
        "mock",
        lease_ms=3000,
        in_progress_ms=4000,
        budget_left=budget,
        idle=idle,
        worker_id=worker,
        free_slots=free,
    )


async def next_message(pubsub: PubSub) -> dict[str, Any]:
    """The next published message (subscribe confirmations are skipped)."""
    async with asyncio.timeout(5):
        while True:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
            if message is not None:
                found: dict[str, Any] = message
                return found


async def terms(redis: Redis, worker: str) -> str | None:
    """The parked terms of ``worker``, or None if it is not parked."""
    found: str | None = await redis.hget(keys.parked_terms("mock"), worker)  # type: ignore[misc]
    return found


async def handed(pubsub: PubSub) -> Claim:
    return parse_handoff((await next_message(pubsub))["data"])


async def test_a_worker_that_finds_the_queue_empty_parks(redis: Redis, queue: Queue) -> None:
    found = await claim(queue, "w1", free=2)
    assert found.request_id is None and not found.more
    assert await redis.zrange(keys.parked("mock"), 0, -1) == ["w1"]
    assert await terms(redis, "w1") == "2|-1|1|3000|4000|-1"
    assert 0 < await redis.pttl(keys.parked("mock")) <= 60_000


async def test_a_request_is_claimed_for_the_parked_worker_and_sent_to_it(
    redis: Redis, queue: Queue, listener: PubSub
) -> None:
    await listener.subscribe(keys.handoff("w1", "mock"))
    await claim(queue, "w1", free=2)
    assert await enqueue_costing(queue, "r1", cost=7, score=42) == Placed.HANDED_OFF
    got = await handed(listener)
    assert (got.request_id, got.score, got.cost, got.job, got.attempt) == (
        "r1",
        42,
        7,
        b'{"job": "r1"}',
        1,
    )
    # Claimed exactly as CLAIM would have: running with a lease, never queued.
    assert await redis.zcard(keys.queue("mock")) == 0
    assert await redis.zscore(keys.running("mock"), "r1") is not None
    assert await redis.hget(keys.leases("mock"), "r1") == "42:7:1"  # type: ignore[misc]
    assert await redis.get(keys.retry("r1", "mock")) == "1"
    assert 0 < await redis.pttl(keys.in_progress("r1", "mock")) <= 4000
    assert await redis.zscore(keys.deadlines("mock"), "r1") is None
    # One slot left: still parked, with one free.
    assert await terms(redis, "w1") == "1|-1|0|3000|4000|-1"


async def test_no_hand_off_under_a_policy_version_below_the_models(
    redis: Redis, listener: PubSub
) -> None:
    """A hand-off is a claim, under one version of the pool policy: a worker parked under
    a version below its model's floor is handed nothing (the request is queued, and its
    claim, refused as stale, reads the policy again), nor does an API process whose
    policy is behind hand off."""
    await listener.subscribe(keys.handoff("w1", "mock"))
    await store.set_values(redis, {"max_queue_depth": 50}, None, "op")

    async def holding() -> Queue:
        live = LivePolicy(redis, live_ms=5000)
        await live.refresh()
        return Queue(redis, stream_maxlen=100, ttl_seconds=60, policy=live)

    worker, behind = await holding(), await holding()
    await claim(worker, "w1", free=3)
    assert await terms(redis, "w1") == "3|-1|1|3000|4000|1"
    await store.set_values(redis, {"fairness": "fifo"}, "mock", "op")  # floor of mock: 2
    api = await holding()
    assert await enqueue_costing(api, "r1") == Placed.QUEUED
    assert await redis.zrange(keys.queue("mock"), 0, -1) == ["r1"]
    assert await terms(redis, "w1") is None  # unparked: it parks with its next claim
    got = await claim(worker, "w1", free=3)  # refused as stale, then made under version 2
    assert got.request_id == "r1" and await terms(redis, "w1") == "2|-1|0|3000|4000|2"
    assert await enqueue_costing(behind, "r2") == Placed.QUEUED  # its policy is version 1
    assert await redis.zrange(keys.queue("mock"), 0, -1) == ["r2"]
    assert (await claim(worker, "w1", free=2)).request_id == "r2"
    assert await enqueue_costing(api, "r3") == Placed.HANDED_OFF
    assert (await handed(listener)).request_id == "r3"


async def test_terms_without_a_policy_version_are_still_handed_requests(
    redis: Redis, queue: Queue, listener: PubSub
) -> None:
    """A worker of the release before parks with terms that name no policy version
    (during a rolling upgrade): it is handed requests as one that holds no policy."""
    await listener.subscribe(keys.handoff("w1", "mock"))
    await claim(queue, "w1", free=2)
    await redis.hset(keys.parked_terms("mock"), "w1", "2|-1|1|3000|4000")  # type: ignore[misc]
    await redis.set(keys.policy_version("mock"), 3)
    assert await enqueue_costing(queue, "r1") == Placed.HANDED_OFF
    assert (await handed(listener)).request_id == "r1"


async def test_a_parked_worker_whose_heartbeat_is_older_than_its_lease_is_skipped(
    redis: Redis, queue: Queue, listener: PubSub
) -> None:
    # A worker cut off from Redis leaves a half-open subscription that PUBLISH counts.
    await listener.subscribe(keys.handoff("w1", "mock"))
    await claim(queue, "w1", free=2)
    beat = await redis.zscore(keys.beats("mock"), "w1")
    assert beat is not None
    await redis.zadd(keys.beats("mock"), {"w1": beat - 3001})  # older than its 3 s lease
    assert await enqueue_costing(queue, "r1") == Placed.QUEUED
    assert await redis.zrange(keys.queue("mock"), 0, -1) == ["r1"]
    assert await redis.zcard(keys.running("mock")) == 0
    assert await terms(redis, "w1") is None


async def test_the_hand_off_that_takes_the_last_free_slot_unparks(
    redis: Redis, queue: Queue, listener: PubSub
) -> None:
    await listener.subscribe(keys.handoff("w1", "mock"))
    await claim(queue, "w1", free=1)
    assert await enqueue_costing(queue, "r1") == Placed.HANDED_OFF
    assert await redis.zcard(keys.parked("mock")) == 0
    assert await enqueue_costing(queue, "r2") == Placed.QUEUED
    assert await redis.zrange(keys.queue("mock"), 0, -1) == ["r2"]


async def test_a_parked_worker_that_does_not_listen_is_dropped_and_the_request_queued(
    redis: Redis, queue: Queue, listener: PubSub
) -> None:
    await listener.subscribe(keys.wake("mock"))
    await claim(queue, "gone", free=4)  # parked, but nobody reads its channel
    assert await enqueue_costing(queue, "r1") == Placed.QUEUED
    assert await redis.zcard(keys.parked("mock")) == 0
    assert await terms(redis, "gone") is None
    assert await redis.zrange(keys.queue("mock"), 0, -1) == ["r1"]
    assert (await next_message(listener))["data"] == "r1"  # the usual wake-up went out


async def test_parked_workers_take_turns(redis: Redis, queue: Queue, listener: PubSub) -> None:
    await listener.subscribe(keys.handoff("w1", "mock"), keys.handoff("w2", "mock"))
    await claim(queue, "w1", free=4)
    await claim(queue, "w2", free=4)
    assert await enqueue_costing(queue, "r1") == Placed.HANDED_OFF
    assert await enqueue_costing(queue, "r2") == Placed.HANDED_OFF
    first, second = await next_message(listener), await next_message(listener)
    assert [(m["channel"], parse_handoff(m["data"]).request_id) for m in (first, second)] == [
        (keys.handoff("w1", "mock"), "r1"),
        (keys.handoff("w2", "mock"), "r2"),
    ]


async def test_no_hand_off_over_budget_or_past_a_queued_request(
    redis: Redis, queue: Queue, listener: PubSub
) -> None:
    await listener.subscribe(keys.handoff("w1", "mock"))
    await claim(queue, "w1", free=4, budget=5, idle=False)
    assert await enqueue_costing(queue, "big", cost=10) == Placed.QUEUED
    assert await redis.zrange(keys.parked("mock"), 0, -1) == ["w1"]  # it still fits others
    # "small" fits the budget, but "big" is queued ahead of it: order comes first.
    assert await enqueue_costing(queue, "small", cost=1, score=2) == Placed.QUEUED
    assert await redis.zrange(keys.queue("mock"), 0, -1) == ["big", "small"]
    assert await listener.get_message(True, timeout=0.2) is None


async def test_a_claim_says_whether_requests_remain_and_parks_on_the_last(
    redis: Redis, queue: Queue
) -> None:
    await enqueue_costing(queue, "r1", score=1)
    await enqueue_costing(queue, "r2", score=2)
    first = await claim(queue, "w1", free=3)
    assert (first.request_id, first.more) == ("r1", True)
    assert await redis.zcard(keys.parked("mock")) == 0
    last = await claim(queue, "w1", free=2)
    assert (last.request_id, last.more) == ("r2", False)
    assert await terms(redis, "w1") == "1|-1|0|3000|4000|-1"


async def test_an_idle_worker_is_handed_requests_and_runs_them(
    redis: Redis, start_worker: StartWorker, start_api: StartApi, listener: PubSub
) -> None:
    await start_worker()

    async def parked() -> bool:
        return bool(await redis.zcard(keys.parked("mock")))

    await wait_until(parked, timeout=10, what="the worker to park")
    (worker_id,) = await redis.zrange(keys.parked("mock"), 0, -1)
    await listener.subscribe(keys.handoff(worker_id, "mock"))  # a second reader of its channel
    api = await start_api()
    async with api.client() as client:
        await wait_ready(client)

        async def parked_under_the_pools_policy() -> bool:  # the API's start may change it
            held = await terms(redis, worker_id)
            version = await redis.hget(keys.POLICY, "version")  # type: ignore[misc]
            return held is not None and held.endswith(f"|{version}")

        await wait_until(parked_under_the_pools_policy, timeout=5, what="the worker to re-park")
        rid = await post_request(client, max_tokens=3)
        assert (await handed(listener)).request_id == rid
        done = await wait_status(client, rid, "done")
    assert done["completion_tokens"] == 3


async def test_a_stopping_worker_unparks(redis: Redis, start_worker: StartWorker) -> None:
    worker = await start_worker()

    async def parked() -> bool:
        return bool(await redis.zcard(keys.parked("mock")))

    await wait_until(parked, timeout=10, what="the worker to park")
    await worker.close()
    assert await redis.zcard(keys.parked("mock")) == 0


async def test_a_hand_off_to_a_full_worker_goes_back_to_the_queue(
    redis: Redis, start_worker: StartWorker, start_api: StartApi
) -> None:
    await start_worker(concurrency=1)
    api = await start_api()
    async with api.client() as client:
        await wait_ready(client)
        busy = await post_request(client, max_tokens=400)  # 2 s at 200 tok/s: the slot is taken
        await wait_status(client, busy, "running")
        (worker_id,) = await redis.zrange(keys.WORKERS, 0, -1)
        # A hand-off that crossed a claim: claimed for the worker, which has no slot.
        arq = ClaimingRedis.from_url(api.settings.redis_url)
        queue = Queue(arq, stream_maxlen=100, ttl_seconds=60)
        try:
            late = await post_request(client, max_tokens=2)
            got = await claim(queue, "", free=1)
            assert got.request_id == late and got.job is not None
            message = b"|".join(
                [late.encode(), str(got.score).encode(), str(got.cost).encode(), b"1", got.job]
            )
            assert await redis.publish(keys.handoff(worker_id, "mock"), message) == 1

            async def requeued() -> bool:
                return await redis.zscore(keys.queue("mock"), late) is not None

            await wait_until(requeued, timeout=5, what="the hand-off to be put back")
            assert await redis.zscore(keys.running("mock"), late) is None
        finally:
            await arq.aclose()
        await wait_status(client, late, "done", timeout=20)
