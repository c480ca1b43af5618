"""The routing policies on synthetic cache states, each script against a real Redis.

Workers here are names with a beat (``renew``), a load and a cache set written as a
worker's routing beat would; the claims and enqueues are the real scripts. Each
guard has a test that switches it off (a bound too large to reach) and shows
affinity then holding on: the guard is what made the request move.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from dataclasses import replace
from typing import cast

import pytest
from redis.asyncio import Redis

from llmq.connection import connect_cluster
from llmq.model.blocks import block_hashes
from llmq.protocol import codec, keys
from llmq.protocol.queue import Queue, now_ms
from llmq.protocol.routing import POLICIES, UNMEASURED, Guards, Pace, Routing, session_id
from llmq.settings import CommonSettings
from tests.support.cluster import BOTH_BACKENDS
from tests.support.jobs import Placed, enqueue_costing

pytestmark = pytest.mark.timeout(30)

#: A guard bound nobody reaches in a test: the guard is off.
NEVER = 10**9

SYSTEM_A = " ".join(f"a{i}" for i in range(64))  # 4 blocks
SYSTEM_B = " ".join(f"b{i}" for i in range(64))


def routing(policy: str = "prefix", **guards: int | bool) -> Routing:
    return Routing(policy=POLICIES[policy], guards=replace(Guards(), **guards))  # type: ignore[arg-type]


def queue_of(redis: Redis, route: Routing) -> Queue:
    return Queue(redis, stream_maxlen=1000, ttl_seconds=60, routing=route)


async def worker(
    queue: Queue,
    name: str,
    *,
    running: int = 0,
    cached: str = "",
    pace: Pace = UNMEASURED,
) -> None:
    """A live worker of ``mock``: its beat, its load (of 4 slots), pace and cache."""
    await queue.renew("mock", {}, 1000, worker_id=name)
    names = block_hashes(cached.split()) if cached else []
    assert await queue.route_beat(
        "mock",
        name,
        running=running,
        capacity=4,
        ttl_ms=5000,
        stored=names,
        evicted=[],
        cache_size=0,
        full=True,
        pace=pace,
    )


async def enqueue(
    queue: Queue,
    rid: str,
    prompt: str,
    *,
    age_ms: int = 0,
    priority: int = 0,
    session: str | None = None,
    score: int | None = None,
) -> Placed:
    arrival = now_ms() - age_ms
    hint = queue.routing.hint(prompt, priority, session)
    return await enqueue_costing(queue, rid, score=score or arrival, route=hint)


async def claim(queue: Queue, name: str, *, running: int = 0, free: int = 4) -> codec.Claim:
    return await queue.claim(
        "mock",
        lease_ms=1000,
        in_progress_ms=5000,
        budget_left=None,
        idle=running == 0,
        worker_id=name,
        free_slots=free,
        capacity=running + free,
    )


async def stats(queue: Queue) -> dict[str, int]:
    return await queue.routing_stats("mock")


@pytest.fixture
async def store(backend: str, redis: Redis, redis_url: str) -> AsyncIterator[Redis]:
    """``redis``, or on the cluster llmq's own cluster client (which pipelines scripts)."""
    if backend != "cluster":
        yield redis
        return
    client = cast(Redis, connect_cluster(CommonSettings(redis_url=redis_url)))
    yield client
    await client.aclose()


@BOTH_BACKENDS
async def test_a_worker_takes_the_request_whose_prefix_it_holds(redis: Redis, store: Redis) -> None:
    queue = queue_of(store, routing())
    await worker(queue, "A", cached=SYSTEM_A)
    await worker(queue, "B", cached=SYSTEM_B)
    await enqueue(queue, "for-b", SYSTEM_B + " question one", score=1)
    await enqueue(queue, "for-a", SYSTEM_A + " question two", score=2)
    got = await claim(queue, "A")
    assert got.request_id == "for-a"
    assert (await stats(queue))["affinity"] == 1
    assert await redis.hget(keys.overtaken("mock"), "for-b") == "1"  # type: ignore[misc]
    got = await claim(queue, "B")
    assert got.request_id == "for-b"
    assert not await redis.exists(keys.routes("mock"), keys.overtaken("mock"))


async def test_a_claim_marks_the_prefix_as_the_claimers_before_its_engine_reports_it(
    redis: Redis,
) -> None:
    queue = queue_of(redis, routing(max_wait_ms=NEVER))
    await worker(queue, "A", running=1)
    await worker(queue, "B")
    await enqueue(queue, "first", SYSTEM_A + " one")
    assert (await claim(queue, "A", running=1, free=3)).request_id == "first"
    first_block = block_hashes(SYSTEM_A.split())[0]
    assert await redis.sismember(keys.cache("A", "mock"), first_block)  # type: ignore[misc]
    await enqueue(queue, "second", SYSTEM_A + " two")  # arrives during A's prefill
    assert (await claim(queue, "B")).request_id is None
    assert (await claim(queue, "A", running=1, free=3)).request_id == "second"


async def test_fifo_takes_the_head_and_writes_no_routing_state(redis: Redis) -> None:
    queue = queue_of(redis, routing("fifo"))
    await worker(queue, "A", cached=SYSTEM_A)
    await enqueue(queue, "first", SYSTEM_B, score=1)
    await enqueue(queue, "second", SYSTEM_A, score=2)
    assert (await claim(queue, "A")).request_id == "first"
    assert not await redis.exists(
        keys.routes("mock"), keys.overtaken("mock"), keys.routing_stats("mock")
    )


async def test_a_worker_leaves_a_request_another_holds_and_is_told_when_to_retry(
    redis: Redis,
) -> None:
    queue = queue_of(redis, routing(max_wait_ms=2000))
    await worker(queue, "A")
    await worker(queue, "B", running=2, cached=SYSTEM_B)
    await enqueue(queue, "for-b", SYSTEM_B + " hello")
    got = await claim(queue, "A")
    assert got.request_id is None
    assert 0 < got.retry_ms <= 2000
    assert await redis.zscore(keys.parked("mock"), "A") is not None  # parked meanwhile
    assert (await stats(queue))["held"] == 1
    assert (await claim(queue, "B", running=2, free=2)).request_id == "for-b"


async def test_wait_guard_a_request_held_past_the_bound_is_anyones(redis: Redis) -> None:
    for bound, taken in ((1000, True), (NEVER, False)):
        await redis.flushall()
        queue = queue_of(redis, routing(max_wait_ms=bound))
        await worker(queue, "A")
        await worker(queue, "B", running=2, cached=SYSTEM_B)
        await enqueue(queue, "old", SYSTEM_B, age_ms=5000)  # queued long ago: no matter
        assert (await claim(queue, "A")).request_id is None  # held for B from now
        since = int(await redis.hget(keys.held("mock"), "old"))  # type: ignore[misc]
        await redis.hset(keys.held("mock"), "old", str(since - 1500))  # type: ignore[misc]
        got = await claim(queue, "A")
        assert (got.request_id == "old") is taken, bound
        assert (await stats(queue))["guard_wait"] == (1 if taken else 0)
        assert await redis.hexists(keys.held("mock"), "old") is not taken  # type: ignore[misc]


async def test_overtaking_guard_bounds_how_often_a_request_is_passed(redis: Redis) -> None:
    for bound, passes in ((2, 2), (NEVER, 4)):
        await redis.flushall()
        queue = queue_of(redis, routing(max_overtakes=bound, max_wait_ms=NEVER))
        await worker(queue, "A", cached=SYSTEM_A)
        await worker(queue, "B", running=3, cached=SYSTEM_B)
        await enqueue(queue, "head", SYSTEM_B, score=1)
        for i in range(4):
            await enqueue(queue, f"a{i}", SYSTEM_A + f" q{i}", score=2 + i)
        taken = [(await claim(queue, "A", running=0)).request_id for _ in range(4)]
        assert taken.index("head") == passes if "head" in taken else passes == 4, (bound, taken)
        if bound == 2:
            assert (await stats(queue))["guard_overtakes"] == 1


async def test_load_guard_a_far_busier_holder_is_not_preferred(redis: Redis) -> None:
    for imbalance, taken in ((2, True), (NEVER, False)):
        await redis.flushall()
        queue = queue_of(redis, routing(imbalance=imbalance, max_wait_ms=NEVER))
        await worker(queue, "A")
        await worker(queue, "B", running=4, cached=SYSTEM_B)
        await enqueue(queue, "for-b", SYSTEM_B)
        got = await claim(queue, "A")
        assert (got.request_id == "for-b") is taken, imbalance
        assert (await stats(queue))["guard_load"] == (1 if taken else 0)


#: A full holder's wait for a slot: one of its 4 runs of 2 s ends every 500 ms.
HOLDER = Pace(service_ms=2000, block_us=1000)
#: A claimer that computes SYSTEM_B's 4 blocks in 800 ms, and one that does in 400 ms.
SLOW_PREFILL = Pace(service_ms=2000, block_us=200_000)
FAST_PREFILL = Pace(service_ms=2000, block_us=100_000)


async def test_adaptive_load_guard_weighs_the_holders_wait_against_the_recompute(
    redis: Redis,
) -> None:
    """A full holder is waited for while its expected wait for a slot is shorter than
    the claimer's recompute of what it holds; counting the requests already left for
    it, so a queue of its prefix spreads once the holder's backlog outweighs the
    recompute."""
    queue = queue_of(redis, routing(max_wait_ms=NEVER))
    assert queue.routing.guards.imbalance is None  # adaptive, by default
    await worker(queue, "B", running=4, cached=SYSTEM_B, pace=HOLDER)
    await worker(queue, "A", pace=SLOW_PREFILL)
    await enqueue(queue, "b1", SYSTEM_B + " one", score=1)
    await enqueue(queue, "b2", SYSTEM_B + " two", score=2)
    # b1: B's wait is 500 ms, recomputing 4 blocks 800 ms: left to B. b2 queues behind
    # it for B (1,000 ms): recomputing is shorter, A takes it.
    got = await claim(queue, "A")
    assert got.request_id == "b2"
    counts = await stats(queue)
    assert counts["held"] == 1 and counts["guard_load"] == 1
    # A claimer that recomputes in 400 ms does not wait 500 ms for B.
    await worker(queue, "A", running=1, pace=FAST_PREFILL)
    assert (await claim(queue, "A", running=1, free=3)).request_id == "b1"


async def test_adaptive_load_guard_waits_for_a_holder_with_a_free_slot_or_no_pace(
    redis: Redis,
) -> None:
    for holder, running, claimer in (
        ("free slot", 3, FAST_PREFILL),
        ("unmeasured holder", 4, FAST_PREFILL),
        ("unmeasured claimer", 4, UNMEASURED),
    ):
        await redis.flushall()
        queue = queue_of(redis, routing(max_wait_ms=NEVER))
        pace = UNMEASURED if holder == "unmeasured holder" else HOLDER
        await worker(queue, "B", running=running, cached=SYSTEM_B, pace=pace)
        await worker(queue, "A", pace=claimer)
        await enqueue(queue, "b1", SYSTEM_B + " one")
        assert (await claim(queue, "A")).request_id is None, holder


async def test_adaptive_load_guard_in_the_hand_off(redis: Redis) -> None:
    """An arrival is queued for a full holder only while its wait is shorter than the
    parked worker's recompute; else the parked worker takes it."""
    for parked, taker in ((SLOW_PREFILL, None), (FAST_PREFILL, "A")):
        await redis.flushall()
        queue = queue_of(redis, routing())
        await worker(queue, "A", pace=parked)
        await worker(queue, "B", running=4, cached=SYSTEM_B, pace=HOLDER)
        assert (await claim(queue, "A")).request_id is None  # parks
        if taker is None:
            assert await enqueue(queue, "r", SYSTEM_B) == Placed.QUEUED
            assert (await stats(queue))["handoff_held"] == 1
        else:
            assert await handed_to(redis, queue, "r", SYSTEM_B, "A") == taker


async def test_priority_guard_no_cached_request_overtakes_a_more_urgent_one(
    redis: Redis,
) -> None:
    for guard, first in ((True, "urgent"), (False, "cached")):
        await redis.flushall()
        queue = queue_of(redis, routing(priority=guard, max_wait_ms=NEVER))
        await worker(queue, "A", cached=SYSTEM_A)
        await enqueue(queue, "urgent", SYSTEM_B, priority=-5, score=1)
        await enqueue(queue, "cached", SYSTEM_A, priority=5, score=2)
        assert (await claim(queue, "A")).request_id == first, guard
        assert (await stats(queue))["guard_priority"] == (1 if guard else 0)


async def test_a_session_prefers_the_worker_that_served_it_last(redis: Redis) -> None:
    queue = queue_of(redis, routing(max_wait_ms=NEVER))
    await worker(queue, "A")
    await worker(queue, "B")
    await enqueue(queue, "turn-1", "hi there", session="alice")
    assert (await claim(queue, "B")).request_id == "turn-1"
    await enqueue(queue, "turn-2", "hi there again", session="alice")
    assert (await claim(queue, "A")).request_id is None  # B served alice last
    assert (await claim(queue, "B", running=1, free=3)).request_id == "turn-2"
    await enqueue(queue, "other", "hello", session="bob")
    assert (await claim(queue, "A")).request_id == "other"


async def test_a_dead_workers_cache_counts_for_nothing(redis: Redis) -> None:
    queue = queue_of(redis, replace(routing(max_wait_ms=NEVER), guards=Guards(live_ms=500)))
    await worker(queue, "A")
    await worker(queue, "B", cached=SYSTEM_B)
    await enqueue(queue, "for-b", SYSTEM_B)
    assert (await claim(queue, "A")).request_id is None
    # B stops beating: once its beat is older than the liveness bound, A takes it
    await redis.zadd(keys.beats("mock"), {"B": 1})
    assert (await claim(queue, "A")).request_id == "for-b"


async def test_the_hand_off_goes_to_the_parked_worker_holding_the_prefix(
    redis: Redis,
) -> None:
    for policy, taker in (("prefix", "B"), ("fifo", "A")):
        await redis.flushall()
        queue = queue_of(redis, routing(policy))
        await worker(queue, "A")
        await worker(queue, "B", cached=SYSTEM_B)
        async with redis.pubsub() as pubsub:
            await pubsub.subscribe(keys.handoff("A", "mock"), keys.handoff("B", "mock"))
            assert (await claim(queue, "A")).request_id is None  # parks first
            assert (await claim(queue, "B")).request_id is None
            assert await enqueue(queue, "r", SYSTEM_B + " why") == Placed.HANDED_OFF
            message = None
            while message is None:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
            assert message["channel"] == keys.handoff(taker, "mock"), policy


async def handed_to(
    redis: Redis, queue: Queue, rid: str, prompt: str, *workers: str, session: str | None = None
) -> str:
    """Enqueue ``rid`` while ``workers`` are parked: the one it was handed to."""
    async with redis.pubsub() as pubsub:
        await pubsub.subscribe(*(keys.handoff(w, "mock") for w in workers))
        assert await enqueue(queue, rid, prompt, session=session) == Placed.HANDED_OFF
        message = None
        while message is None:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
        return str(message["channel"]).removeprefix(keys.handoff_prefix("mock"))


async def test_the_hand_off_prefers_the_least_loaded_among_equal_holders(redis: Redis) -> None:
    """Both hold the prompt: the parked worker running fewest takes it, not the first
    parked; a prompt nobody holds goes to the first parked, as under FIFO."""
    for policy, prompt, taker in (
        ("prefix", SYSTEM_A, "B"),
        ("prefix", SYSTEM_B, "A"),
        ("fifo", SYSTEM_A, "A"),
    ):
        await redis.flushall()
        queue = queue_of(redis, routing(policy))
        await worker(queue, "A", running=2, cached=SYSTEM_A)
        await worker(queue, "B", cached=SYSTEM_A)
        assert (await claim(queue, "A", running=2, free=2)).request_id is None  # parks first
        assert (await claim(queue, "B")).request_id is None
        assert await handed_to(redis, queue, "r", prompt, "A", "B") == taker, (policy, prompt)


async def test_load_guard_a_far_busier_parked_holder_is_not_handed_the_request(
    redis: Redis,
) -> None:
    for imbalance, taker in ((2, "A"), (NEVER, "B")):
        await redis.flushall()
        queue = queue_of(redis, routing(imbalance=imbalance))
        await worker(queue, "A")
        await worker(queue, "B", running=3, cached=SYSTEM_B)
        assert (await claim(queue, "A")).request_id is None
        assert (await claim(queue, "B", running=3, free=1)).request_id is None
        assert await handed_to(redis, queue, "r", SYSTEM_B, "A", "B") == taker, imbalance
        assert (await stats(queue))["guard_load"] == (1 if taker == "A" else 0)


async def test_a_session_keeps_its_busier_parked_worker_where_a_shared_prefix_spreads(
    redis: Redis,
) -> None:
    """The parked load guard moves a shared prefix off a busier worker, not a session:
    a session sends one request at a time, so following it piles nothing up."""
    for session, taker in (("alice", "B"), (None, "A")):
        await redis.flushall()
        queue = queue_of(redis, routing(imbalance=2))
        await worker(queue, "A")
        await worker(queue, "B", running=3, cached=SYSTEM_B)
        if session:
            await redis.set(keys.session_prefix("mock") + session_id(session), "B")
        assert (await claim(queue, "A")).request_id is None
        assert (await claim(queue, "B", running=3, free=1)).request_id is None
        assert await handed_to(redis, queue, "r", SYSTEM_B, "A", "B", session=session) == taker


async def test_an_arrival_waits_for_a_busy_holder_rather_than_a_parked_stranger(
    redis: Redis,
) -> None:
    queue = queue_of(redis, routing())
    await worker(queue, "A")
    await worker(queue, "B", running=4, cached=SYSTEM_B)
    async with redis.pubsub() as pubsub:
        await pubsub.subscribe(keys.handoff("A", "mock"))
        assert (await claim(queue, "A")).request_id is None
        assert await enqueue(queue, "r", SYSTEM_B) == Placed.QUEUED
    assert (await stats(queue))["handoff_held"] == 1


async def test_hash_routes_a_first_block_to_one_worker_and_least_loaded_to_the_idlest(
    redis: Redis,
) -> None:
    queue = queue_of(redis, routing("hash", max_wait_ms=NEVER))
    await worker(queue, "A")
    await worker(queue, "B")
    await enqueue(queue, "r", SYSTEM_A)
    a, b = await claim(queue, "A"), await claim(queue, "B")
    assert {a.request_id, b.request_id} == {"r", None}
    await redis.flushall()
    queue = queue_of(redis, routing("least-loaded", max_wait_ms=NEVER))
    await worker(queue, "A", running=3)
    await worker(queue, "B", running=1)
    await enqueue(queue, "r", "anything at all")
    assert (await claim(queue, "A", running=3, free=1)).request_id is None
    assert (await claim(queue, "B", running=1, free=3)).request_id == "r"


async def test_route_beat_sends_changes_and_asks_for_the_whole_cache_when_lost(
    redis: Redis,
) -> None:
    queue = queue_of(redis, routing())

    async def beat(stored: list[str], evicted: list[str], size: int, full: bool = False) -> bool:
        return await queue.route_beat(
            "mock",
            "A",
            running=1,
            capacity=4,
            ttl_ms=5000,
            stored=stored,
            evicted=evicted,
            cache_size=size,
            full=full,
        )

    assert await beat(["x", "y"], [], 0)
    assert await beat(["z"], ["x"], 2)
    members = await cast("Awaitable[set[str]]", redis.smembers(keys.cache("A", "mock")))
    assert members == {"y", "z"}
    assert 0 < await redis.pttl(keys.cache("A", "mock")) <= 5000
    assert await redis.hget(keys.loads("mock"), "A") == "1|4|0|0"  # type: ignore[misc]
    await redis.delete(keys.cache("A", "mock"))  # expired, or Redis lost it
    assert not await beat(["w"], [], 2)
    assert await beat(["w", "y", "z"], [], 0, full=True)
    members = await cast("Awaitable[set[str]]", redis.smembers(keys.cache("A", "mock")))
    assert members == {"w", "y", "z"}
    await queue.forget_worker("mock", "A")
    assert not await redis.exists(keys.cache("A", "mock"))
    assert not await redis.hexists(keys.loads("mock"), "A")  # type: ignore[misc]


async def test_a_claim_says_how_many_leading_blocks_the_claimer_held(redis: Redis) -> None:
    """The claim's ``matched_blocks`` (the queue wait's span shows it): the claimer's
    cached leading blocks of the request's prompt, not counting the session bonus of
    its rank; unknown (-1) where no policy caches."""
    queue = queue_of(redis, routing())
    half = " ".join(SYSTEM_A.split()[:32])  # the first 2 of SYSTEM_A's 4 blocks
    await worker(queue, "A", cached=half)
    await enqueue(queue, "first", SYSTEM_A + " one", session="s")
    got = await claim(queue, "A")
    assert (got.request_id, got.matched_blocks) == ("first", 2)
    # A holds all 4 now (a claim marks them) and is the session's last worker
    await enqueue(queue, "second", SYSTEM_A + " two", session="s")
    got = await claim(queue, "A", running=1, free=3)
    assert (got.request_id, got.matched_blocks) == ("second", 4)
    await redis.flushall()
    queue = queue_of(redis, routing("fifo"))
    await worker(queue, "A", cached=SYSTEM_A)
    await enqueue(queue, "third", SYSTEM_A + " three")
    got = await claim(queue, "A")
    assert (got.request_id, got.matched_blocks) == ("third", -1)


async def test_a_traced_claim_says_what_it_overtook_how_long_it_was_held_and_what_let_it_go(
    redis: Redis,
) -> None:
    """For the queue wait's span: the requests queued ahead that the claimed one went
    before, how long it was left to a busy holder, and the guard that made it anyone's;
    nothing of it (-1, "") for a worker that does not trace."""
    queue = queue_of(redis, routing(max_wait_ms=1000))
    await worker(queue, "A", cached=SYSTEM_A)
    await worker(queue, "B", running=2, cached=SYSTEM_B)
    await enqueue(queue, "for-b", SYSTEM_B, score=1)
    await enqueue(queue, "for-a", SYSTEM_A, score=2)
    got = await queue.claim(
        "mock", lease_ms=1000, in_progress_ms=5000, budget_left=None, idle=True,
        worker_id="A", free_slots=4, capacity=4, traced=True,
    )  # fmt: skip
    assert (got.request_id, got.overtook, got.held_ms, got.released_by) == ("for-a", 1, -1, "")
    since = int(await redis.hget(keys.held("mock"), "for-b"))  # type: ignore[misc]
    await redis.hset(keys.held("mock"), "for-b", str(since - 1500))  # type: ignore[misc]
    got = await queue.claim(
        "mock", lease_ms=1000, in_progress_ms=5000, budget_left=None, idle=False,
        worker_id="A", free_slots=3, capacity=4, traced=True,
    )  # fmt: skip
    assert (got.request_id, got.overtook, got.released_by) == ("for-b", 0, "guard_wait")
    assert 1500 <= got.held_ms < 10_000
    await enqueue(queue, "later", SYSTEM_A + " more", score=3)
    untraced = await claim(queue, "A", running=2, free=2)
    assert (untraced.request_id, untraced.overtook, untraced.held_ms) == ("later", -1, -1)
    assert untraced.released_by == ""
