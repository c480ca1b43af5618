"""Each queue script against a real Redis: the lease clock, leases, fences, writes, and
each script's refusals (a full queue, a stale attempt, a lease not due, a dead process)."""

from __future__ import annotations

import json
from collections.abc import Awaitable
from dataclasses import dataclass, field, replace
from typing import Any, cast

import pytest
from redis.asyncio import Redis
from redis.crc import key_slot
from redis.exceptions import ResponseError

from llmq import metrics
from llmq.protocol import codec, keys, slots, streams
from llmq.protocol.queue import Queue, now_ms
from llmq.protocol.scripts import scripts_for
from llmq.schema import (
    DoneEvent,
    Event,
    Lifecycle,
    StartedEvent,
    Timings,
    TokensEvent,
    Usage,
    decode_event,
)
from tests.support.jobs import enqueue_call, enqueue_costing, enqueue_raw

pytestmark = pytest.mark.timeout(30)

#: The lease clock's cap per call (llmq/protocol/lua/clock.lua).
CAP_MS = 300


@pytest.fixture
def queue(redis: Redis) -> Queue:
    return Queue(redis, stream_maxlen=1000, ttl_seconds=60)


#: The lease clock of the model's slot (running requests); keys.CLOCK is the global
#: slot's (API processes).
MODEL_CLOCK = keys.clock("mock")


async def lease_clock(redis: Redis, clock: str = MODEL_CLOCK) -> tuple[int, int]:
    real, lease = await redis.hmget(clock, ["real", "lease"])  # type: ignore[misc]
    return int(real), int(lease)


async def set_clock(redis: Redis, clock: str = MODEL_CLOCK, **fields: int) -> None:
    """Write a lease clock directly, as if calls had come at other times."""
    await cast("Awaitable[int]", redis.hset(clock, mapping=fields))


async def claim(queue: Queue, lease_ms: int = 1000) -> codec.Claim:
    return await queue.claim(
        "mock", lease_ms=lease_ms, in_progress_ms=5000, budget_left=None, idle=True
    )


async def test_the_lease_clock_follows_real_time_but_skips_a_gap(
    queue: Queue, redis: Redis
) -> None:
    await queue.reap("mock")
    real, lease = await lease_clock(redis)
    # Redis was away (or stalled) for 10 s: the clock last saw it 10 s ago
    await set_clock(redis, real=real - 10_000, lease=lease)
    await queue.reap("mock")
    after_real, after_lease = await lease_clock(redis)
    assert after_real >= real
    assert after_lease - lease <= CAP_MS  # not 10 s
    assert after_lease - lease == CAP_MS  # but the cap, as a call a full interval later


async def test_a_lease_survives_a_gap_but_not_real_silence(queue: Queue, redis: Redis) -> None:
    await enqueue_raw(queue, "r1", b"{}")
    got = await claim(queue, lease_ms=1000)
    assert got.request_id == "r1" and got.attempt == 1
    real, lease = await lease_clock(redis)
    # a 5 s stall: the reaper's next call finds the lease alive
    await set_clock(redis, real=real - 5_000, lease=lease)
    assert await queue.reap("mock") == []
    # 1.2 s of live lease time without a renewal: reaped, and the attempt fenced off
    _, lease = await lease_clock(redis)
    await set_clock(redis, lease=lease + 1_200)
    assert await queue.reap("mock") == [("r1", 1)]
    assert await redis.hget(keys.fence("r1"), "attempt") == "2"  # type: ignore[misc]
    assert await redis.zscore(keys.queue("mock"), "r1") is not None
    assert 0 < await redis.ttl(keys.fence("r1")) <= 60


async def test_renewal_reports_lost_and_cancelled(queue: Queue, redis: Redis) -> None:
    for rid in ("a", "b", "c"):
        await enqueue_raw(queue, rid, b"{}")
        await claim(queue)
    await queue.cancel("mock", "b")  # running: only the flag (and a message) says so
    _, lease = await lease_clock(redis)
    await set_clock(redis, lease=lease + 5_000)
    await redis.zadd(keys.running("mock"), {"a": lease + 20_000, "b": lease + 20_000})
    reaped = await queue.reap("mock")  # c's lease ran out
    assert reaped == [("c", 1)]
    news = await queue.renew("mock", {"a": 1, "b": 1, "c": 1}, lease_ms=1000)
    assert news == {"a": "ok", "b": "cancelled", "c": "lost"}
    # a stale attempt is lost even where the lease exists
    assert await queue.renew("mock", {"a": 7}, lease_ms=1000) == {"a": "lost"}


async def test_release_and_requeue_need_the_attempt_that_holds_the_lease(
    queue: Queue, redis: Redis
) -> None:
    await enqueue_raw(queue, "r1", b"{}")
    first = await claim(queue)
    assert not await queue.release("mock", "r1", first.attempt + 1)
    assert await queue.requeue("mock", "r1", first.attempt)
    assert await redis.hget(keys.fence("r1"), "attempt") == "2"  # type: ignore[misc]
    second = await claim(queue)
    assert second.attempt == 2
    assert not await queue.requeue("mock", "r1", first.attempt)  # stale: refused
    assert not await queue.release("mock", "r1", first.attempt)
    assert await redis.zscore(keys.running("mock"), "r1") is not None
    assert await queue.release("mock", "r1", second.attempt)
    assert await redis.zcard(keys.running("mock")) == 0


@dataclass
class Writes:
    """One request's writes in a batch (:class:`llmq.protocol.streams.RunWrites`)."""

    attempt: int
    events: list[Event]
    record: dict[str, str] = field(default_factory=dict)
    notes: list[Lifecycle] = field(default_factory=list)


async def publish_many(redis: Redis, writes: dict[str, Writes], by_slot: bool = False) -> Any:
    """The writes of several requests as :func:`streams.publish_calls` builds them, each
    call sent by itself; the replies per request."""
    sha = await redis.script_load(scripts_for(redis).publish.script)
    out: dict[str, Any] = {}
    for command, request_ids in streams.publish_calls(
        sha, writes, ttl=60, maxlen=1000, lifecycle_maxlen=1000, by_slot=by_slot
    ):
        replies = await redis.execute_command(*command)  # type: ignore[no-untyped-call]
        out.update(zip(request_ids, replies, strict=True))
    return out


async def test_a_batch_writes_each_request_as_its_own_call(redis: Redis) -> None:
    """``publish.lua`` writes each request of a call as if it were alone: a fenced
    request is refused and a failing one errs, and neither stops the others."""
    await cast("Awaitable[int]", redis.hset(keys.fence("fenced"), "attempt", "2"))
    await redis.set(keys.stream("broken"), "not a stream")
    note = Lifecycle(event="started", request_id="ok", model="mock", ts=0.0)
    writes = {
        "fenced": Writes(1, [TokensEvent(index=0, tokens=["x"])], {"status": "done"}),
        "broken": Writes(1, [TokensEvent(index=0, tokens=["y"])]),
        "ok": Writes(1, [TokensEvent(index=0, tokens=["a", "b"])], {"status": "running"}, [note]),
        "later": Writes(3, [StartedEvent(worker="w", attempt=3, queue_ms=0)]),
    }
    replies = await publish_many(redis, writes)
    assert [replies[r] for r in ("fenced", "ok", "later")] == [0, 1, 1]
    assert isinstance(replies["broken"], ResponseError)
    assert await redis.exists(keys.stream("fenced"), keys.request("fenced")) == 0
    assert [(e.index, e.tokens) for e in await stream(redis, "ok")] == [(0, ["a", "b"])]
    assert await redis.hget(keys.request("ok"), "status") == "running"  # type: ignore[misc]
    assert [f["request_id"] for _, f in await redis.xrange(keys.lifecycle("ok"))] == ["ok"]
    assert await redis.hget(keys.fence("later"), "attempt") == "3"  # type: ignore[misc]
    # the same writes again (a flush retried after a lost reply): nothing lands twice
    del writes["broken"]
    assert await publish_many(redis, writes) == {"fenced": 0, "ok": 1, "later": 1}
    assert len(await stream(redis, "ok")) == 1


def test_a_flush_goes_as_one_call_on_a_single_redis_and_one_per_group_on_a_cluster() -> None:
    writes = {f"r{i}": Writes(1, [TokensEvent(index=0, tokens=["t"])]) for i in range(200)}
    one = streams.publish_calls("sha", writes, ttl=1, maxlen=1, lifecycle_maxlen=1, by_slot=False)
    assert [len(ids) for _, ids in one] == [64, 64, 64, 8]  # MAX_WRITES_PER_CALL
    grouped = streams.publish_calls(
        "sha", writes, ttl=1, maxlen=1, lifecycle_maxlen=1, by_slot=True
    )
    for command, ids in grouped:
        assert len({keys.request_group(r) for r in ids}) == 1
        n = command[2]
        assert len({key_slot(k.encode()) for k in command[3 : 3 + n]}) == 1
    assert sorted(r for _, ids in grouped for r in ids) == sorted(writes)


async def publish(redis: Redis, rid: str, attempt: int, *events: Event, **record: str) -> int:
    """One request's writes, alone in their call."""
    replies = await publish_many(redis, {rid: Writes(attempt, list(events), record)})
    return int(replies[rid])


def done(completion_tokens: int) -> DoneEvent:
    return DoneEvent(
        finish_reason="length",
        usage=Usage(prompt_tokens=3, completion_tokens=completion_tokens, total_tokens=0),
        timings=Timings(queue_ms=1.5, prefill_ms=0, decode_ms=2.25),
    )


async def stream(redis: Redis, rid: str) -> list[Any]:
    return [decode_event(f) for _, f in await redis.xrange(keys.stream(rid))]


async def test_a_fenced_write_is_refused_and_lands_nowhere(redis: Redis) -> None:
    await cast("Awaitable[int]", redis.hset(keys.fence("r1"), "attempt", "2"))
    assert await publish(redis, "r1", 1, TokensEvent(index=0, tokens=["a"]), status="done") == 0
    assert await redis.exists(keys.stream("r1"), keys.request("r1")) == 0
    assert await publish(redis, "r1", 2, StartedEvent(worker="w", attempt=2, queue_ms=0)) == 1
    assert await publish(redis, "r1", 3, TokensEvent(index=0, tokens=["a"])) == 1
    # attempt 3 wrote: attempt 2 is fenced off from now on
    assert await publish(redis, "r1", 2, TokensEvent(index=1, tokens=["b"])) == 0
    assert len(await stream(redis, "r1")) == 2


async def test_retried_tokens_are_written_once_and_the_end_counts_the_stream(
    redis: Redis,
) -> None:
    assert await publish(redis, "r2", 1, TokensEvent(index=0, tokens=["a", "b", "c"])) == 1
    # a retry after a lost reply, merged with newer tokens: only the new part lands
    retried = TokensEvent(index=1, tokens=["b", "c", "d", "é"])
    assert await publish(redis, "r2", 1, retried, TokensEvent(index=0, tokens=["a"])) == 1
    # the producer claims 9 tokens; the stream holds 5
    assert await publish(redis, "r2", 1, done(9), completion_tokens="9", status="done") == 1
    events = await stream(redis, "r2")
    assert [(e.index, e.tokens) for e in events[:-1]] == [(0, ["a", "b", "c"]), (3, ["d", "é"])]
    end = events[-1]
    assert isinstance(end, DoneEvent)
    assert (end.usage.completion_tokens, end.usage.total_tokens) == (5, 8)
    assert end.timings.decode_ms == 2.25
    record = await redis.hgetall(keys.request("r2"))  # type: ignore[misc]
    assert record == {"completion_tokens": "5", "status": "done"}
    # a terminal write retried after a lost reply adds nothing
    assert await publish(redis, "r2", 1, done(5)) == 1
    assert len(await stream(redis, "r2")) == 3
    raw = (await redis.xrange(keys.stream("r2")))[1][1]["data"]
    assert json.loads(raw)["tokens"] == ["d", "é"]


async def test_an_api_process_lease_survives_a_gap_but_not_real_silence(
    queue: Queue, redis: Redis
) -> None:
    await queue.api_beat("api-1", grace_seconds=1.0)
    await cast("Awaitable[int]", redis.sadd(keys.attached("api-1"), "r1:mock"))
    real, lease = await lease_clock(redis, keys.CLOCK)
    await set_clock(redis, keys.CLOCK, real=real - 10_000, lease=lease)  # a 10 s stall
    assert await queue.cancel_orphans() == []
    _, lease = await lease_clock(redis, keys.CLOCK)
    await set_clock(redis, keys.CLOCK, lease=lease + 1_500)  # 1.5 s without a beat
    assert await queue.cancel_orphans() == ["r1"]
    assert await redis.exists(keys.cancel_flag("r1", "mock")) == 1
    assert await redis.zscore(keys.APIS, "api-1") is None  # forgotten once empty


async def test_record_writes_the_record_and_note_and_unrecord_takes_both_back(
    queue: Queue, redis: Redis
) -> None:
    """``record.lua`` writes a request's record and ``queued`` note in its slot;
    ``unrecord.lua`` (a refusal) deletes both, and the group's lifecycle stream if the
    note was all it held, so that a refused request leaves no key."""
    call = enqueue_call("r1", attach_to="api-1")
    notes, _, _ = await queue._record([call])
    assert (await redis.hgetall(keys.request("r1")))["status"] == "queued"  # type: ignore[misc]
    assert 0 < await redis.pttl(keys.request("r1")) <= queue.ttl * 1000
    [(note_id, fields)] = await redis.xrange(keys.lifecycle("r1"))
    assert note_id == notes[0] and fields["event"] == "queued" and fields["model"] == "mock"
    assert await redis.sismember(keys.attached("api-1"), keys.attached_member("r1", "mock"))  # type: ignore[misc]

    await queue._unrecord([call], notes)
    assert not await redis.exists(keys.request("r1"), keys.lifecycle("r1"))
    assert not await redis.sismember(keys.attached("api-1"), keys.attached_member("r1", "mock"))  # type: ignore[misc]

    # Another request's note in the same group stays, and so does the stream.
    other = next(f"o{i}" for i in range(1000) if keys.lifecycle(f"o{i}") == keys.lifecycle("r1"))
    await queue._record([enqueue_call(other)])
    notes, _, _ = await queue._record([call])
    await queue._unrecord([call], notes)
    assert [f["request_id"] for _, f in await redis.xrange(keys.lifecycle("r1"))] == [other]


async def test_a_batch_the_queue_has_no_room_for_is_refused_whole(
    queue: Queue, redis: Redis
) -> None:
    """``enqueue_batch.lua`` admits all of a request's choices or none: refused, none
    is queued, and each one's record and note are taken back."""
    assert (await queue.admit([enqueue_call("a")], max_depth=3)).queued
    batch = [enqueue_call(rid) for rid in ("b", "c", "d")]
    assert not (await queue.admit(batch, max_depth=3)).queued  # 1 + 3 > 3
    assert await redis.zrange(keys.queue("mock"), 0, -1) == ["a"]
    for rid in ("b", "c", "d"):
        assert not await redis.exists(keys.request(rid), keys.job(rid, "mock"))
    assert (await queue.admit(batch[:2], max_depth=3)).queued  # room for two: both go in
    assert sorted(await redis.zrange(keys.queue("mock"), 0, -1)) == ["a", "b", "c"]


async def test_orphans_takes_at_most_the_limit_and_forgets_a_dead_process_once_empty(
    redis: Redis,
) -> None:
    """``orphans.lua``: the attached requests of API processes dead in lease time,
    at most ``limit`` per call; a dead process is forgotten only once it has none
    left, and a live one is not touched."""
    scripts = scripts_for(redis)
    await redis.zadd(keys.APIS, {"dead-1": 1, "dead-2": 2, "live": 2**50})
    attached = {"dead-1": ["a:mock"], "dead-2": ["b:mock", "c:mock", "d:mock"], "live": ["e:mock"]}
    for process, members in attached.items():
        await cast("Awaitable[int]", redis.sadd(keys.attached(process), *members))

    async def take(limit: int) -> list[str]:
        orphans = slots.Orphans(
            apis_key=keys.APIS,
            clock_key=keys.CLOCK,
            attached_prefix=keys.ATTACHED_PREFIX,
            limit=limit,
        )
        return list(await orphans.run(scripts))

    # dead-1's one, then as many of dead-2's as the limit leaves room for
    first = await take(2)
    assert first[0] == "a:mock" and len(first) == 2 and first[1] in attached["dead-2"]
    # dead-1 is empty: forgotten; dead-2 still holds two: kept for the next call
    assert await redis.zrange(keys.APIS, 0, -1) == ["dead-2", "live"]
    rest = await take(10)
    assert sorted(first + rest) == ["a:mock", "b:mock", "c:mock", "d:mock"]
    assert await redis.zrange(keys.APIS, 0, -1) == ["live"]
    assert await redis.smembers(keys.attached("live")) == {"e:mock"}  # type: ignore[misc]
    assert await take(10) == []


async def test_worker_beat_scores_by_lease_time_and_drops_the_dead_with_their_info(
    redis: Redis,
) -> None:
    """``worker_beat.lua``: a stall of Redis does not age the other workers' entries;
    lease time beyond the TTL drops an entry and its info key."""
    scripts = scripts_for(redis)
    ttl_ms = 1000

    async def beat_as(worker: str) -> None:
        await slots.WorkerBeat(
            workers_key=keys.WORKERS,
            info_key=keys.worker(worker),
            clock_key=keys.CLOCK,
            worker_id=worker,
            info=f'{{"id": "{worker}"}}',
            ttl_ms=ttl_ms,
            info_prefix=keys.worker(""),
        ).run(scripts)

    await beat_as("w1")
    _, lease = await lease_clock(redis, keys.CLOCK)
    assert await redis.zscore(keys.WORKERS, "w1") == lease
    assert 0 < await redis.pttl(keys.worker("w1")) <= 4 * ttl_ms
    real, lease = await lease_clock(redis, keys.CLOCK)
    await set_clock(redis, keys.CLOCK, real=real - 10_000, lease=lease)  # a 10 s stall
    await beat_as("w2")
    assert await redis.zrange(keys.WORKERS, 0, -1) == ["w1", "w2"]
    _, lease = await lease_clock(redis, keys.CLOCK)
    await set_clock(redis, keys.CLOCK, lease=lease + ttl_ms + 1)  # w1 silent for a TTL
    await beat_as("w2")
    assert await redis.zrange(keys.WORKERS, 0, -1) == ["w2"]
    assert not await redis.exists(keys.worker("w1"))
    assert await redis.exists(keys.worker("w2"))


async def test_enqueue_refuses_a_full_queue_and_leaves_no_trace(queue: Queue, redis: Redis) -> None:
    """``enqueue.lua`` returns 0 when the queue holds ``max_depth``: no job, no cost,
    no deadline; the caller then takes back the record and note."""
    assert (await queue.admit([enqueue_call("a")], max_depth=1)).queued
    assert not (await queue.admit([enqueue_call("b", attach_to="api-1")], max_depth=1)).queued
    assert await redis.zrange(keys.queue("mock"), 0, -1) == ["a"]
    assert await redis.hkeys(keys.costs("mock")) == ["a"]  # type: ignore[misc]
    assert await redis.zrange(keys.deadlines("mock"), 0, -1) == ["a"]
    assert not await redis.exists(keys.job("b", "mock"), keys.request("b"))
    assert not await redis.exists(keys.attached("api-1"))


async def test_a_claim_drops_and_reports_a_cancelled_request_on_its_way(
    queue: Queue, redis: Redis
) -> None:
    """``claim.lua``: a queued request whose cancel flag is set (its cancel raced
    with the claim) is removed with its job and reported, and the next one taken."""
    await enqueue_raw(queue, "gone", b"{}")
    await enqueue_raw(queue, "next", b"{}")
    await redis.set(keys.cancel_flag("gone", "mock"), "1")
    got = await claim(queue)
    assert got.cancelled == ["gone"] and got.expired == []
    assert got.request_id == "next"
    assert not await redis.exists(keys.job("gone", "mock"))
    assert await redis.zscore(keys.deadlines("mock"), "gone") is None


async def test_cancel_removes_a_queued_request_and_flags_any_other(
    queue: Queue, redis: Redis
) -> None:
    """``cancel.lua``: 1 and every trace gone for a queued request; 0 for one that is
    running or unknown, whose flag (with its TTL) and message tell its worker."""
    await enqueue_raw(queue, "queued", b"{}")
    assert await queue.cancel("mock", "queued")
    assert await redis.zcard(keys.queue("mock")) == 0
    assert not await redis.exists(keys.job("queued", "mock"), keys.cancel_flag("queued", "mock"))
    assert await redis.hlen(keys.costs("mock")) == 0  # type: ignore[misc]
    assert await redis.zcard(keys.deadlines("mock")) == 0
    async with redis.pubsub() as pubsub:
        await pubsub.subscribe(keys.cancel_channel("mock"))
        assert not await queue.cancel("mock", "unknown")
        message = None
        while message is None or message["type"] != "message":
            message = await pubsub.get_message(timeout=5)
            assert message is not None, "no cancel message"
        assert message["data"] == "unknown"
    assert 0 < await redis.pttl(keys.cancel_flag("unknown", "mock")) <= queue.ttl * 1000


async def test_sweep_expires_only_queued_requests_past_their_deadline_up_to_the_limit(
    queue: Queue, redis: Redis
) -> None:
    """``sweep.lua``: a request past its deadline is removed and reported; one
    claimed meanwhile (deadline left behind) is forgotten, not reported; the rest wait
    for the next call when the limit is reached."""
    past = now_ms() - 1
    for rid in ("late-1", "late-2", "claimed"):
        await enqueue_costing(queue, rid, deadline_ms=past)
    await enqueue_costing(queue, "timely")
    await redis.zrem(keys.queue("mock"), "claimed")
    scripts = scripts_for(redis)

    async def sweep(limit: int) -> list[str]:
        sweep = slots.Sweep(
            deadlines_key=keys.deadlines("mock"),
            queue_key=keys.queue("mock"),
            costs_key=keys.costs("mock"),
            routes_key=keys.routes("mock"),
            overtaken_key=keys.overtaken("mock"),
            held_key=keys.held("mock"),
            fair_key=keys.fair("mock"),
            now_ms=now_ms(),
            limit=limit,
            job_prefix=keys.job_prefix("mock"),
        )
        return list(await sweep.run(scripts))

    swept = await sweep(2)
    swept += await sweep(2)
    assert sorted(swept) == ["late-1", "late-2"]
    assert await redis.zrange(keys.queue("mock"), 0, -1) == ["timely"]
    assert await redis.zrange(keys.deadlines("mock"), 0, -1) == ["timely"]
    assert not await redis.exists(keys.job("late-1", "mock"), keys.job("late-2", "mock"))
    assert await redis.hkeys(keys.costs("mock")) == ["claimed", "timely"]  # type: ignore[misc]


async def test_a_finish_by_an_attempt_that_lost_its_lease_changes_nothing(
    redis: Redis,
) -> None:
    """A worker stopped (SIGSTOP, cut off) between its terminal write and its finish is
    reaped; when it wakes, its finish changes nothing: the job stays for the re-run's
    claim, and the tenant's tokens are counted once, by the attempt holding the lease."""
    tally = metrics.Tally()
    queue = Queue(redis, stream_maxlen=1000, ttl_seconds=60, tally=tally)
    await enqueue_raw(queue, "r1", b'{"job": 1}')
    usage = {"tenant": "acme", "prompt_tokens": 7, "completion_tokens": 5}
    await cast("Awaitable[int]", redis.hset(keys.request("r1"), mapping=usage))
    first = await claim(queue, lease_ms=1000)
    _, lease = await lease_clock(redis)
    await set_clock(redis, lease=lease + 2_000)
    assert await queue.reap("mock") == [("r1", first.attempt)]
    await queue.finish("mock", "r1", first.attempt)  # the stopped worker wakes
    assert not tally.take()
    second = await claim(queue)
    assert second.request_id == "r1" and second.attempt == first.attempt + 1
    assert second.job == b'{"job": 1}'
    await queue.finish("mock", "r1", second.attempt)
    counted = [v for (name, _, _), v in tally.take().items() if name == metrics.TENANT_TOKENS.name]
    assert sum(counted) == 12
    assert not await redis.exists(keys.job("r1", "mock"), keys.retry("r1", "mock"))


async def test_reap_requeues_only_a_due_lease_of_the_fenced_attempt(
    queue: Queue, redis: Redis
) -> None:
    """``reap.lua``'s second call: a pair whose attempt is not the lease's (a newer
    claim took it) or whose lease is not due is refused; a lease without a valid
    value is dropped."""
    await enqueue_raw(queue, "r1", b"{}")
    await enqueue_raw(queue, "r2", b"{}")
    first, second = await claim(queue, lease_ms=1000), await claim(queue, lease_ms=60_000)
    await redis.zadd(keys.running("mock"), {"broken": 0})
    await cast("Awaitable[int]", redis.hset(keys.leases("mock"), "broken", "junk"))
    _, lease = await lease_clock(redis)
    await set_clock(redis, lease=lease + 2_000)  # r1's lease is due, r2's is not
    reap = slots.Reap(
        running_key=keys.running("mock"),
        queue_key=keys.queue("mock"),
        leases_key=keys.leases("mock"),
        costs_key=keys.costs("mock"),
        clock_key=keys.clock("mock"),
        fair_key=keys.fair("mock"),
        tenants_key=keys.fair_tenants("mock"),
        limit=10,
        wake_channel=keys.wake("mock"),
        in_progress_prefix=keys.in_progress_prefix("mock"),
        fairq_prefix=keys.fairq_prefix("mock"),
    )
    scripts = scripts_for(redis)
    assert first.request_id == "r1" and second.request_id == "r2"
    wrong = ["r1", first.attempt + 1, "r2", second.attempt, "broken", 0]
    assert await replace(reap, fenced=wrong).run(scripts) == []
    assert await redis.zrange(keys.running("mock"), 0, -1) == ["r1", "r2"]
    assert await redis.hget(keys.leases("mock"), "broken") is None  # type: ignore[misc]
    assert await replace(reap, fenced=["r1", first.attempt]).run(scripts) == [
        "r1",
        first.attempt,
    ]
    assert await redis.zrange(keys.queue("mock"), 0, -1) == ["r1"]
