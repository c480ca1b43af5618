"""The relay: one blocked connection for all streams, exact resume, bad entries skipped."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import BlockingConnectionPool, Connection, Redis

from api.entries import _token_event, decode_data, entry_event
from api.streams.relay import StreamRelay
from api.streams.subscription import parse_id, valid_id
from llmq.connection import connect
from llmq.embedded import EmbeddedRedis
from llmq.schema import TokensEvent, decode_event, encode_event
from llmq.settings import ApiSettings
from tests.support.waiting import wait_until


@pytest.fixture
async def relay(redis_url: str) -> AsyncIterator[StreamRelay]:
    client = Redis.from_url(redis_url, decode_responses=True, socket_timeout=10)
    r = StreamRelay(client, "llmq:ctl:test", block_ms=2000)
    await r.start()
    yield r
    await r.stop()
    await client.aclose()


async def add(redis: Redis, key: str, index: int) -> str:
    entry_id: str = await redis.xadd(key, encode_event(TokensEvent(index=index, tokens=["t"])))  # type: ignore[arg-type]
    return entry_id


async def test_new_subscriber_is_served_without_waiting_for_the_block(
    redis_url: str, redis: Redis
) -> None:
    """A new key is read at once, not when the blocked XREAD times out: the block here
    (20 s) is twice what the second entry is given (10 s), so only the nudge can bring
    it, however slow a loaded machine is."""
    client = Redis.from_url(redis_url, decode_responses=True, socket_timeout=30)
    relay = StreamRelay(client, "llmq:ctl:test", block_ms=20_000)
    await relay.start()
    try:
        first = await relay.subscribe("s:1")
        await add(redis, "s:1", 0)
        assert await first.next(10.0) is not None
        # The relay is now blocked on s:1 only; a new key must be picked up at once.
        second = await relay.subscribe("s:2")
        await add(redis, "s:2", 0)
        assert await second.next(10.0) is not None
    finally:
        await relay.stop()
        await client.aclose()


async def test_many_subscribers_one_connection(relay: StreamRelay, redis: Redis) -> None:
    subs = [await relay.subscribe(f"s:{i}") for i in range(100)]
    for i in range(100):
        await add(redis, f"s:{i}", 0)
    got = await asyncio.gather(*(s.next(10.0) for s in subs))
    assert all(g is not None for g in got)

    async def blocked() -> int:
        """Connections blocked in a command right now (an idle pooled connection whose
        last command was an XREAD does not count)."""
        return sum(1 for c in await redis.client_list() if "b" in c.get("flags", ""))

    async def reading() -> bool:
        return await blocked() > 0

    await wait_until(reading, timeout=5, what="the relay to block again")
    assert await blocked() == 1  # one XREAD for the 100 streams


async def test_resume_after_an_id_and_two_readers_of_one_stream(
    relay: StreamRelay, redis: Redis
) -> None:
    ids = [await add(redis, "s:r", i) for i in range(5)]
    late = await relay.subscribe("s:r", ids[2])
    full = await relay.subscribe("s:r")
    got_late = [await late.next(10.0) for _ in range(2)]
    got_full = [await full.next(10.0) for _ in range(5)]
    assert [g[0] for g in got_late if g] == ids[3:]
    assert [g[0] for g in got_full if g] == ids
    assert await late.next(0.05) is None


async def test_entries_that_arrived_together_come_as_one_batch_in_order(
    relay: StreamRelay, redis: Redis
) -> None:
    """What a subscriber has not taken yet is handed over at once, in stream order,
    so its response writes it in one send; an empty batch means none arrived."""
    ids = [await add(redis, "s:b", i) for i in range(5)]
    sub = await relay.subscribe("s:b")
    await wait_until(lambda: len(sub.items) == 5, timeout=10, what="the entries to arrive")
    batch = await sub.batch(10.0)
    assert [stream_id for stream_id, _ in batch] == ids
    assert [e.index for _, e in batch if isinstance(e, TokensEvent)] == list(range(5))
    assert await sub.batch(0.05) == []
    later = await add(redis, "s:b", 5)
    assert [stream_id for stream_id, _ in await sub.batch(10.0)] == [later]


async def test_a_wait_ends_at_its_own_timeout_whatever_the_waits_before_it(
    relay: StreamRelay, redis: Redis
) -> None:
    """One timer per subscription serves every wait: a short wait after a long one
    still ends on time, a wait that an entry ends leaves no early timeout behind for
    the next, and an unsubscribed subscription keeps no timer."""
    loop = asyncio.get_running_loop()
    sub = await relay.subscribe("s:t")
    await add(redis, "s:t", 0)
    assert await sub.next(30.0) is not None  # a long wait, ended by an entry
    start = loop.time()
    assert await sub.next(0.2) is None
    # ended by its own 0.2 s timer, not the long wait's 30 s (the upper bound is only a
    # loaded machine's margin)
    assert 0.15 <= loop.time() - start < 10.0
    await add(redis, "s:t", 1)
    assert await sub.next(1.0) is not None  # ended by the entry, well before its timer
    start = loop.time()
    assert await sub.next(2.0) is None  # not cut short by the previous wait's timer
    assert loop.time() - start >= 1.95
    relay.unsubscribe(sub)
    assert sub._timer is None


async def test_malformed_entries_are_stepped_over(relay: StreamRelay, redis: Redis) -> None:
    sub = await relay.subscribe("s:bad")
    await redis.xadd("s:bad", {"data": "garbage"})
    await redis.xadd("s:bad", {"unexpected": "field"})
    good = await add(redis, "s:bad", 0)
    item = await sub.next(10.0)
    assert item is not None and item[0] == good
    await wait_until(lambda: sub.last_id == good, timeout=10, what="last id to advance")


async def test_the_read_command_is_the_one_redis_py_packs(relay: StreamRelay, redis: Redis) -> None:
    """The relay keeps each stream's key and position encoded between reads; the
    command it sends must be, byte for byte, redis-py's packing of the positions its
    subscribers read from (the lowest of a stream's), after subscribing, moving and
    unsubscribing."""

    def reference(subs: dict[str, list[str]]) -> bytes:
        keys = [relay._control, *subs]
        ids = [relay._control_id]
        ids += [min(positions, key=parse_id) for positions in subs.values()]
        args: list[str | int] = ["XREAD", "COUNT", 512, "BLOCK", 2000, "STREAMS", *keys, *ids]
        return b"".join(Connection().pack_command(*args))

    a = await relay.subscribe("s:a")
    b1 = await relay.subscribe("s:b", "1-5")
    b0 = await relay.subscribe("s:b", "1-2")  # the lower position is where s:b is read
    c = await relay.subscribe("s:c", "0-7")
    assert relay._command() == reference({"s:a": ["0-0"], "s:b": ["1-5", "1-2"], "s:c": ["0-7"]})
    first = await add(redis, "s:a", 0)
    assert await a.next(10.0) is not None  # s:a moved
    relay.unsubscribe(b0)  # s:b is now read from its other subscriber's position
    relay.unsubscribe(c)
    assert relay._command() == reference({"s:a": [first], "s:b": ["1-5"]})
    relay.unsubscribe(a)
    relay.unsubscribe(b1)
    assert relay._command() == reference({})


def test_stream_ids() -> None:
    assert parse_id("5-2") == (5, 2) < parse_id("5-10") < parse_id("6-0")
    assert valid_id("0-0") and valid_id("1700000000000-3") and valid_id("12")
    assert not valid_id("x-1") and not valid_id("") and not valid_id("-1-2")


class CountingRelay(StreamRelay):
    nudges = 0

    async def _nudge(self) -> None:
        self.nudges += 1
        await super()._nudge()


async def test_a_burst_of_subscribers_costs_a_few_nudges(redis_url: str, redis: Redis) -> None:
    """Nudges are coalesced: a burst of new streams must not queue one round trip each
    on the relay's two-connection pool (under load that exhausted it)."""
    pool = BlockingConnectionPool.from_url(
        redis_url, decode_responses=True, max_connections=2, timeout=0.5
    )
    client = Redis(connection_pool=pool, socket_timeout=10)
    relay = CountingRelay(client, "llmq:ctl:burst", block_ms=2000)
    await relay.start()
    try:
        subs = await asyncio.gather(*(relay.subscribe(f"b:{i}") for i in range(300)))
        for i in range(300):
            await add(redis, f"b:{i}", 0)
        got = await asyncio.gather(*(s.next(10.0) for s in subs))
        assert all(g is not None for g in got)
        assert relay.nudges <= 3
    finally:
        await relay.stop()
        await client.aclose(close_connection_pool=True)


def test_fast_token_decoding_agrees_with_validation() -> None:
    """Token events skip pydantic on the relay's hot path; the result must be the same."""
    event = TokensEvent(index=3, tokens=[" a", " b"])
    assert decode_data(encode_event(event)["data"]) == event
    for raw in (
        '{"type":"tokens","index":0,"tokens":["a"]}',
        '{"type":"tokens","index":-1,"tokens":["a"]}',
        '{"type":"tokens","index":1,"tokens":[]}',
        '{"type":"tokens","index":1,"tokens":[2]}',
        '{"type":"tokens","index":1,"tokens":["a",null]}',
        '{"type":"tokens","index":"1","tokens":["a"]}',
        '{"type":"tokens","index":1,"tokens":["a"],"extra":0}',
        '{"type":"tokens","index":1',
        '{"type":"tokens","index":01,"tokens":["a"]}',
        '{"type":"tokens","index":+1,"tokens":["a"]}',
        '{"type":"tokens","index":1,"tokens":["a",]}',
        '{"type":"tokens","index":1,"tokens":["a"]}}',
        '{"type":"tokens","index":1,"tokens":["a"] }',
        '{"type":"tokens","index":1,"tokens":["a\\"]}',
        '{"type":"tokens","index":1,"tokens":["\x01"]}',
        '{"type":"tokens","index":1,"tokens":["a" "b"]}',
    ):
        assert decode_data(raw) == decode_event({"data": raw}), raw
        # an entry as the workers write it, read by the relay's shortcut, and others
        for fields in (["type", "tokens", "data", raw], ["data", raw, "type", "tokens"]):
            assert entry_event(fields) == decode_event({"data": raw}), fields
    event_raw = encode_event(event)["data"]
    assert entry_event(["type", "tokens", "data", event_raw]) == event
    assert entry_event(["type", "tokens", "note", event_raw]) is None  # no data field


#: Tokens whose JSON needs care: quotes, backslashes, control characters, escapes
#: that look like the envelope, non-ASCII and astral characters.
TRICKY_TOKENS = [
    " plain",
    "",
    '"',
    "\\",
    '","tokens":["',
    "]}",
    "\n\t\r\x00\x1f\x7f",
    "\\u0041",
    "é中文",
    "😀👍🏽",
    "\u2028\u2029",
    "</script>",
]


def test_fast_token_decoding_reads_every_token_the_workers_write() -> None:
    """Each tricky token, alone and all in one event, comes back exactly, and the
    event is the one pydantic builds (the same fields, set the same way)."""
    for tokens in [[t] for t in TRICKY_TOKENS] + [TRICKY_TOKENS]:
        event = TokensEvent(index=12345678901, tokens=tokens)
        raw = encode_event(event)["data"]
        assert raw == event.model_dump_json()  # written by hand, as pydantic writes it
        fast = _token_event(raw)  # the fast way must take every one of them
        assert fast is not None, raw
        assert decode_data(raw) == fast == event, raw
        assert isinstance(fast, TokensEvent) and fast.tokens == tokens
        assert fast.model_dump_json() == raw
        constructed = TokensEvent.model_construct(index=1, tokens=["a"])
        assert fast.model_fields_set == constructed.model_fields_set


@pytest.mark.timeout(30)
async def test_a_stalled_read_ends_at_the_socket_timeout(
    own_redis: EmbeddedRedis, caplog: pytest.LogCaptureFixture
) -> None:
    """The relay holds its read's deadline itself: a Redis that stops answering is
    an outage once the connection's socket timeout passes, and the relay reads
    again after it."""
    client = Redis.from_url(own_redis.url, decode_responses=True, socket_timeout=0.5)
    relay = StreamRelay(client, "llmq:ctl:test", block_ms=100)
    writer = Redis.from_url(own_redis.url, decode_responses=True)
    await relay.start()
    try:
        sub = await relay.subscribe("s:1")
        with caplog.at_level(logging.INFO, logger="api.streams.relay"):
            stalled = await writer.connection_pool.get_connection()
            await stalled.send_command("DEBUG", "SLEEP", "1.5")  # Redis stalls from now
            await wait_until(
                lambda: any("lost Redis" in r.getMessage() for r in caplog.records),
                timeout=1.4,
                what="the stalled read to time out",
            )
            await stalled.read_response()
            await writer.connection_pool.release(stalled)
            await add(writer, "s:1", 0)
            assert await sub.next(5.0) is not None
        assert client.connection_pool.connection_kwargs["socket_timeout"] == 0.5
    finally:
        await relay.stop()
        await client.aclose()
        await writer.aclose()


#: How long Redis stays away in the restart test: long enough for the retries to
#: reach the backoff's cap (0.5 s), several times over.
#: Long enough that a doubling delay would have grown past the bound below: from 40 ms,
#: its attempts fall at 2.5 s and 5.1 s, then 10.2 s, 4 s after Redis is back.
OUTAGE_S = 6.0


@pytest.mark.timeout(60)
@pytest.mark.slow
async def test_a_restart_is_logged_once_and_followed_within_the_backoff_cap(
    own_redis: EmbeddedRedis, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis restarted under a subscriber: one warning for the outage (not one per
    retry), and the relay reads again promptly once Redis is back: within the
    backoff's cap plus a reconnect, not a doubling delay grown during the outage."""
    settings = ApiSettings(redis_url=own_redis.url, redis_socket_timeout_seconds=1.0)
    # built as the API builds it: its own small pool, the same retrying connections
    client = connect(settings, max_connections=2, socket_timeout=0.5 + 5)
    relay = StreamRelay(client, "llmq:ctl:test", block_ms=500)
    writer = Redis.from_url(own_redis.url, decode_responses=True)
    await relay.start()
    try:
        sub = await relay.subscribe("s:1")
        await add(writer, "s:1", 0)
        assert await sub.next(10.0) is not None
        with caplog.at_level(logging.INFO, logger="api.streams.relay"):
            own_redis.kill()
            await asyncio.sleep(OUTAGE_S)  # the fault: Redis is away this long
            await asyncio.to_thread(own_redis.start)
            back = time.monotonic()
            await add(writer, "s:1", 1)
            got = await sub.next(10.0)
            delay = time.monotonic() - back
        lost = [r for r in caplog.records if "lost Redis" in r.getMessage()]
        reconnected = [r for r in caplog.records if "reconnected" in r.getMessage()]
    finally:
        await relay.stop()
        await client.aclose(close_connection_pool=True)
        await writer.aclose()
    assert got is not None and got[1] == TokensEvent(index=1, tokens=["t"])
    # measured 0.1 s; bounded by the backoff's cap (0.5 s) plus a reconnect's own
    # retries (0.3 s), with a loaded machine's margin; a doubling delay would be 4 s
    assert delay < 2.5, delay
    assert len(lost) == 1 and lost[0].levelno == logging.WARNING
    assert len(reconnected) == 1
