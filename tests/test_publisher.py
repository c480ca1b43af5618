"""Stream writes: coalesced tokens, TTLs, bounded length, one round trip per flush."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from llmq.embedded import EmbeddedRedis
from llmq.policy.live import LivePolicy
from llmq.policy.store import set_values
from llmq.protocol import keys
from llmq.schema import DoneEvent, StartedEvent, Timings, TokensEvent, Usage, decode_event
from worker.publisher import StreamPublisher


@pytest.fixture
async def publisher(redis: Redis) -> AsyncIterator[StreamPublisher]:
    p = StreamPublisher(redis, maxlen=16, ttl_seconds=60, max_event_tokens=50)
    p.start()
    yield p
    await p.stop()


def done() -> DoneEvent:
    return DoneEvent(
        finish_reason="length",
        usage=Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2),
        timings=Timings(queue_ms=0, prefill_ms=0, decode_ms=0),
    )


async def read(redis: Redis, rid: str) -> list[object]:
    return [decode_event(f) for _, f in await redis.xrange(keys.stream(rid))]


async def test_tokens_ready_together_are_coalesced(
    publisher: StreamPublisher, redis: Redis
) -> None:
    await publisher.emit("r1", StartedEvent(worker="w", attempt=1, queue_ms=0))
    for i in range(120):
        publisher.token("r1", i, f" t{i}")
    await publisher.emit("r1", done(), record={"status": "done"})
    events = await read(redis, "r1")
    tokens = [e for e in events if isinstance(e, TokensEvent)]
    assert [t.index for t in tokens] == [0, 50, 100]  # capped at max_event_tokens
    assert [len(t.tokens) for t in tokens] == [50, 50, 20]
    assert isinstance(events[0], StartedEvent) and isinstance(events[-1], DoneEvent)
    assert await redis.hget(keys.request("r1"), "status") == "done"  # type: ignore[misc]
    assert 0 < await redis.ttl(keys.request("r1")) <= 60


async def test_every_stream_expires_and_is_bounded(
    publisher: StreamPublisher, redis: Redis
) -> None:
    await publisher.emit("r2", StartedEvent(worker="w", attempt=1, queue_ms=0))
    for i in range(500):
        publisher.token("r2", i, "x")
        if i % 2:
            await publisher.emit("r2", StartedEvent(worker="w", attempt=2, queue_ms=0))
    await publisher.emit("r2", done())
    assert 0 < await redis.ttl(keys.stream("r2")) <= 60
    # MAXLEN ~ trims whole nodes: a little over the cap, never the full 750 entries
    assert await redis.xlen(keys.stream("r2")) < 16 + 128


async def test_interleaved_streams_keep_their_order(
    publisher: StreamPublisher, redis: Redis
) -> None:
    for i in range(30):
        publisher.token("a", i, f"a{i}")
        publisher.token("b", i, f"b{i}")
    await publisher.emit("a", done())
    await publisher.emit("b", done())
    for rid in ("a", "b"):
        tokens = [t for e in await read(redis, rid) if isinstance(e, TokensEvent) for t in e.tokens]
        assert tokens == [f"{rid}{i}" for i in range(30)]


async def test_writes_that_cannot_land_are_kept_in_order_and_logged_once(
    own_redis: EmbeddedRedis, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis goes away mid-stream: nothing is dropped, the order holds, the waiter of
    the terminal event waits until it is written, and the outage is logged once."""
    client = Redis.from_url(own_redis.url, decode_responses=True)
    p = StreamPublisher(client, maxlen=1000, ttl_seconds=60, max_event_tokens=4)
    p.start()
    try:
        await p.emit("r", StartedEvent(worker="w", attempt=1, queue_ms=0))
        for i in range(5):
            p.token("r", i, f"t{i}")
        await asyncio.sleep(0)
        await asyncio.to_thread(own_redis.kill)
        for i in range(5, 12):
            p.token("r", i, f"t{i}")
        with caplog.at_level(logging.WARNING, logger="worker.publisher"):
            ended = asyncio.ensure_future(p.emit("r", done(), record={"status": "done"}))
            await asyncio.sleep(0.5)  # the outage: many retries
            assert not ended.done()
            await asyncio.to_thread(own_redis.start)
            await asyncio.wait_for(ended, timeout=10)
        events = await read(client, "r")
    finally:
        await p.stop()
        await client.aclose()
    tokens = [t for e in events if isinstance(e, TokensEvent) for t in e.tokens]
    assert tokens == [f"t{i}" for i in range(12)]
    assert isinstance(events[-1], DoneEvent)
    assert isinstance(events[-1], DoneEvent) and events[-1].usage.completion_tokens == 12
    assert len([r for r in caplog.records if "stream writes failed" in r.message]) == 1


async def test_a_flush_whose_replies_are_lost_is_retried_without_writing_anything_twice(
    own_redis: EmbeddedRedis, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis stalls with a flush of two streams unread; the publisher's read times out
    and it drops the connection, but Redis still runs the calls once it wakes up, and
    the retry runs them again: no token index and no terminal event lands twice."""
    client = Redis.from_url(own_redis.url, decode_responses=True, socket_timeout=0.2)
    admin = Redis.from_url(own_redis.url, decode_responses=True)
    p = StreamPublisher(client, maxlen=1000, ttl_seconds=60, max_event_tokens=50)
    p.start()
    try:
        for rid in ("a", "b"):
            await p.emit(rid, StartedEvent(worker="w", attempt=1, queue_ms=0))
        await admin.config_resetstat()
        stalled = await admin.connection_pool.get_connection()
        await stalled.send_command("DEBUG", "SLEEP", "0.6")  # Redis stalls from now
        with caplog.at_level(logging.WARNING, logger="worker.publisher"):
            for rid in ("a", "b"):
                for i in range(6):
                    p.token(rid, i, f"{rid}{i}")
            ended = [p.post(rid, done(), record={"status": "done"}) for rid in ("a", "b")]
            await asyncio.wait_for(asyncio.gather(*ended), timeout=10)
        await stalled.read_response()
        await admin.connection_pool.release(stalled)
        calls = (await admin.info("commandstats"))["cmdstat_evalsha"]["calls"]
        events = {rid: await read(admin, rid) for rid in ("a", "b")}
    finally:
        await p.stop()
        await client.aclose()
        await admin.aclose()
    assert any("stream writes failed" in r.message for r in caplog.records)
    # one script call per flush, for both streams
    assert calls >= 2, "the lost flush ran, and so did its retry"
    for rid, stream in events.items():
        tokens = [(e.index, e.tokens) for e in stream if isinstance(e, TokensEvent)]
        assert tokens == [(0, [f"{rid}{i}" for i in range(6)])]
        assert [type(e).__name__ for e in stream[1:]] == ["TokensEvent", "DoneEvent"]
        assert isinstance(stream[-1], DoneEvent) and stream[-1].usage.completion_tokens == 6


async def test_written_is_done_once_what_was_queued_for_the_request_has_landed(
    publisher: StreamPublisher, redis: Redis
) -> None:
    assert publisher.written("w").done()  # nothing queued
    for i in range(3):
        publisher.token("w", i, f"w{i}")
    landed = publisher.written("w")
    assert not landed.done()
    await asyncio.wait_for(landed, timeout=5)
    tokens = [t for e in await read(redis, "w") if isinstance(e, TokensEvent) for t in e.tokens]
    assert tokens == ["w0", "w1", "w2"]


async def test_flushes_keep_one_connection_and_replace_it_when_redis_drops_it(
    own_redis: EmbeddedRedis, caplog: pytest.LogCaptureFixture
) -> None:
    """The publisher keeps its connection between flushes (another user of the pool
    gets a different one), and when Redis closes it, the next flush is retried on a
    fresh connection: nothing is lost or written twice."""
    client = Redis.from_url(own_redis.url, decode_responses=True)
    admin = Redis.from_url(own_redis.url, decode_responses=True)
    p = StreamPublisher(client, maxlen=1000, ttl_seconds=60, max_event_tokens=50)
    p.start()
    try:
        p.token("k", 0, "k0")
        await asyncio.wait_for(p.written("k"), timeout=5)
        flushing = [c["id"] for c in await admin.client_list() if c["cmd"] == "evalsha"]
        assert len(flushing) == 1
        other = await client.connection_pool.get_connection()
        try:
            await other.send_command("CLIENT", "ID")
            assert str(await other.read_response()) != flushing[0]
        finally:
            await client.connection_pool.release(other)
        await admin.client_kill_filter(_id=flushing[0])
        with caplog.at_level(logging.WARNING, logger="worker.publisher"):
            p.token("k", 1, "k1")
            await asyncio.wait_for(p.written("k"), timeout=5)
        tokens = [t for e in await read(admin, "k") if isinstance(e, TokensEvent) for t in e.tokens]
    finally:
        await p.stop()
        await client.aclose()
        await admin.aclose()
    assert any("stream writes failed" in r.message for r in caplog.records)
    assert tokens == ["k0", "k1"]


async def test_a_changed_stream_cap_and_lifetime_apply_at_the_next_flush(redis: Redis) -> None:
    """With the live policy's lifetimes, each flush writes under the pool policy as it is
    then: a change made with the policy store applies to the next stream, no restart."""
    live = LivePolicy(redis, live_ms=5000)
    await live.refresh()
    p = StreamPublisher(
        redis, maxlen=10_000, ttl_seconds=3600, max_event_tokens=50, lifetimes=live.pool
    )
    p.start()

    async def fill(rid: str) -> None:
        for _ in range(300):
            await p.emit(rid, StartedEvent(worker="w", attempt=1, queue_ms=0))

    try:
        await fill("before")
        assert await redis.xlen(keys.stream("before")) == 300
        await set_values(redis, {"stream_maxlen": 16, "request_ttl_seconds": 30}, None, "op")
        await live.refresh()  # what the process's follower does within a second
        await fill("after")
    finally:
        await p.stop()
    assert await redis.xlen(keys.stream("after")) < 16 + 128  # MAXLEN ~: whole nodes
    assert 0 < await redis.ttl(keys.stream("after")) <= 30
    assert 3000 < await redis.ttl(keys.stream("before")) <= 3600
