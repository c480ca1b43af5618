"""One reader per API process relays every request stream to its waiting clients.

A blocked ``XREAD`` holds a Redis connection for its whole duration, so one per
client does not scale. The relay runs a single loop that reads all subscribed
streams in one ``XREAD`` and fans entries out to per-subscriber queues. A new
subscriber nudges the loop through a tiny per-process control stream, so the
blocked read returns at once and the next one includes the new key.

A subscriber's queue is bounded by construction: it only ever holds entries of
one stream, which is capped at ``stream_maxlen`` entries.

The loop is on every token's path, so it does per read only what changed: the
position of each stream is kept up to date as entries arrive (not recomputed over
every subscriber), the reply is taken as Redis sends it (redis-py's per-entry
dict building is skipped), and token events, nearly all of what it reads, are
decoded without ``json.loads`` or pydantic's validator (:func:`decode_data`).
A subscriber takes everything that arrived for it at once (:meth:`Subscription.batch`),
and waits under one keep-alive timer that stays armed across its waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any

from redis.asyncio import Redis

from llmq.outage import Outage
from llmq.schema import Event, TokensEvent, decode_event, tokens_event
from llmq.tasks import cancel_and_wait

log = logging.getLogger(__name__)

StreamId = tuple[int, int]


def parse_id(stream_id: str) -> StreamId:
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)


#: How a token event written by a worker begins; the index follows.
_TOKENS_HEAD = '{"type":"tokens","index":'
_TOKENS_LIST = ',"tokens":['


def decode_data(raw: str) -> Event | None:
    """The event in a stream entry's ``data`` field; None for a malformed one.

    A token event of exactly the shape the workers write is read by
    :func:`_token_event`; anything else goes through :func:`llmq.schema.decode_event`,
    which validates it and logs what it skips.
    """
    if raw.startswith(_TOKENS_HEAD):
        event = _token_event(raw)
        if event is not None:
            return event
    return decode_event({"data": raw})


def _token_event(raw: str) -> TokensEvent | None:
    """``{"type":"tokens","index":N,"tokens":["...",...]}`` without ``json.loads``.

    This runs for every token the API relays. ``json.loads`` spends most of its
    time in its Python wrappers around the C scanner, and ``model_construct`` in a
    loop over the model's fields; here the index is read with ``int``, each token
    with the C string scanner (``json.decoder.scanstring``, the one ``json.loads``
    uses, so escapes and errors are the same), and the event is assembled as
    ``model_construct`` would. Anything else (whitespace, other fields, a key order
    the workers do not write) returns None and goes the validating way.
    """
    start = len(_TOKENS_HEAD)
    end = raw.find(_TOKENS_LIST, start)
    digits = raw[start:end]
    if end < 0 or not (digits.isascii() and digits.isdigit()) or digits[0] == "0" != digits:
        return None
    pos = end + len(_TOKENS_LIST)
    tokens: list[str] = []
    try:
        while True:
            if raw[pos] != '"':
                return None
            token, pos = scanstring(raw, pos + 1)
            tokens.append(token)
            if raw[pos] != ",":
                break
            pos += 1
    except (ValueError, IndexError):
        return None
    if raw[pos:] != "]}":
        return None
    return tokens_event(int(digits), tokens)


def _data_field(fields: list[str]) -> str | None:
    """The value of ``data`` in a flat ``[name, value, ...]`` entry."""
    if len(fields) == 4 and fields[2] == "data":  # how the workers write it: type, data
        return fields[3]
    for i in range(0, len(fields) - 1, 2):
        if fields[i] == "data":
            return fields[i + 1]
    return None


def _bulk(text: str) -> bytes:
    """One RESP bulk string."""
    data = text.encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


def valid_id(stream_id: str) -> bool:
    try:
        ms, seq = parse_id(stream_id)
    except ValueError:
        return False
    return ms >= 0 and seq >= 0


@dataclass(eq=False)
class Subscription:
    """Entries of one stream after ``last_id``, in order; iterate to receive them."""

    key: str
    last_id: str = "0-0"
    #: Arrived and not yet taken; a list, so that :meth:`batch` hands it over whole.
    items: list[tuple[str, Event]] = field(default_factory=list)
    failed: BaseException | None = None
    #: ``last_id`` parsed, kept alongside so that the relay's loop never re-parses it.
    last: StreamId = field(init=False)
    #: The future :meth:`next` waits on while ``items`` is empty.
    _waiter: asyncio.Future[None] | None = field(default=None, init=False)
    #: When the current wait times out (event loop time).
    _deadline: float = field(default=0.0, init=False)
    #: The timer that ends waits past their deadline, and when it fires.
    _timer: asyncio.TimerHandle | None = field(default=None, init=False)
    _timer_at: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        self.last = parse_id(self.last_id)

    def _offer(self, stream_id: str, parsed: StreamId, event: Event | None) -> None:
        """Deliver an entry past ``last_id``; a malformed one (None) is only stepped over."""
        if parsed > self.last:
            self.last_id, self.last = stream_id, parsed
            if event is not None:
                self.items.append((stream_id, event))
                self._wake()

    def _take(self, items: list[tuple[str, Event]], last_id: str) -> None:
        """Deliver entries read from ``last_id`` on, all new to it, the last one ``last_id``
        (malformed ones left out of ``items``): the entries are not compared one by one."""
        self.last_id, self.last = last_id, parse_id(last_id)
        if items:
            self.items += items
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def end(self, event: Event) -> None:
        """Deliver an event of the API's own after what arrived so far, under the last
        id seen (a client that resumes from it misses nothing): it ends the stream."""
        self.items.append((self.last_id, event))
        self._wake()

    async def next(self, timeout: float) -> tuple[str, Event] | None:
        """The next entry, or None if none arrived within ``timeout`` seconds."""
        if not self.items:
            await self._arrival(timeout)
        return self.items.pop(0) if self.items else None

    async def batch(self, timeout: float) -> list[tuple[str, Event]]:
        """Every entry that arrived, in order: at least one, or none if none arrived
        within ``timeout`` seconds.

        A client that fell behind by several entries gets them in one go, so its
        response writes them in one send instead of one per entry.
        """
        if not self.items:
            await self._arrival(timeout)
        items, self.items = self.items, []
        return items

    def _arrival(self, timeout: float) -> asyncio.Future[None]:
        """What to await until an entry arrives or ``timeout`` seconds pass.

        This runs for nearly every token of every stream, and the wait nearly always
        ends with an entry, long before its timeout (the keep-alive interval). A timer
        armed and cancelled per wait cost more than the rest of the wait (uvloop's
        ``call_later`` and ``cancel``), so one timer per
        subscription stays armed across waits: a wait only notes its deadline, and
        the timer, when it fires, ends the wait if the deadline passed and otherwise
        re-arms for it. A bare future rather than a queue, returned rather than awaited
        in a coroutine of its own: nothing else per wait. A wait that ended leaves its
        future done, which the deliveries and the timer step over.
        """
        loop = asyncio.get_running_loop()
        deadline = self._deadline = loop.time() + timeout
        if self._timer is None or deadline < self._timer_at:
            self._arm(loop, deadline)
        waiter = self._waiter = loop.create_future()
        return waiter

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = loop.call_at(when, self._expire), when

    def _expire(self) -> None:
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # not waiting: the next wait arms the timer again
        loop = asyncio.get_running_loop()
        if loop.time() >= self._deadline:
            waiter.set_result(None)
        else:
            self._arm(loop, self._deadline)

    def close(self) -> None:
        """Stop the subscription's timer (it is unsubscribed)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class Subscribing:
    """What a relay offers its readers: :meth:`subscription` in terms of the relay's
    own ``subscribe`` and ``unsubscribe`` (one reader, or one per request group)."""

    async def subscribe(self, key: str, last_id: str = "0-0") -> Subscription:
        raise NotImplementedError

    def unsubscribe(self, sub: Subscription) -> None:
        raise NotImplementedError

    @contextlib.asynccontextmanager
    async def subscription(self, key: str, last_id: str = "0-0") -> AsyncIterator[Subscription]:
        sub = await self.subscribe(key, last_id)
        try:
            yield sub
        finally:
            self.unsubscribe(sub)


class StreamRelay(Subscribing):
    """Owns the reader task; ``start``/``stop`` bracket its life."""

    def __init__(self, redis: Redis, control_key: str, *, block_ms: int, count: int = 512):
        #: The relay's own client: the reader holds one of its connections for good.
        self._redis = redis
        self._control = control_key
        self._block_ms = block_ms
        self._count = count
        self._subs: dict[str, set[Subscription]] = {}
        #: Where the next read starts in each subscribed stream: the lowest position
        #: of its subscribers, updated whenever one of them moves.
        self._pos: dict[str, StreamId] = {}
        #: The same keys and positions as the RESP bulk strings of ``XREAD``, in the
        #: same order as ``_pos`` (the three change together, in
        #: :meth:`_update_position`): each is encoded when it changes, not per read.
        self._key_bulk: dict[str, bytes] = {}
        self._id_bulk: dict[str, bytes] = {}
        self._control_id = "0-0"
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        #: Subscriptions changed since the last nudge was sent (see :meth:`_wake_reader`).
        self._dirty = False
        self._nudger: asyncio.Task[None] | None = None

    @property
    def subscribers(self) -> int:
        return sum(len(s) for s in self._subs.values())

    async def start(self) -> None:
        self._control_id = await self._redis.xadd(
            self._control, {"n": "start"}, maxlen=16, approximate=False
        )
        await self._redis.expire(self._control, 3600)
        self._task = asyncio.create_task(self._run(), name="stream-relay")

    async def stop(self) -> None:
        """Stop the reader by nudging it out of its XREAD, not by cancelling the read.

        Cancelling a blocked read mid-reply can leave its connection unusable; the
        cancel is only the fallback if Redis does not answer.
        """
        if self._nudger is not None:
            await cancel_and_wait([self._nudger], timeout=2)
        if self._task:
            self._stopping = True
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):
                    await self._nudge()
            await asyncio.wait({self._task}, timeout=2)
            await cancel_and_wait([self._task], timeout=5)
            self._task = None
        with contextlib.suppress(Exception):
            await self._redis.delete(self._control)

    async def subscribe(self, key: str, last_id: str = "0-0") -> Subscription:
        sub = Subscription(key, last_id)
        self._subs.setdefault(key, set()).add(sub)
        self._update_position(key)
        self._wake_reader()
        return sub

    def _wake_reader(self) -> None:
        """Get the reader out of its blocked XREAD so that its next one has every key.

        Nudges are coalesced: one at a time, and another only if subscriptions
        changed meanwhile, so a burst of new streams costs a couple of round trips
        on the relay's small pool, not one each (which would exhaust it). Nothing
        waits for the nudge: a subscription reads from its own position, so a late
        nudge only delays its first entries, and without any the reader's block
        timeout still picks it up.
        """
        self._dirty = True
        if self._nudger is None or self._nudger.done():
            self._nudger = asyncio.create_task(self._nudge_while_dirty(), name="relay-nudge")

    async def _nudge_while_dirty(self) -> None:
        while self._dirty and not self._stopping:
            self._dirty = False
            try:
                await self._nudge()
            except Exception as exc:
                log.warning("could not nudge the relay (%s); it reads the new stream later", exc)
                return

    def unsubscribe(self, sub: Subscription) -> None:
        sub.close()
        subs = self._subs.get(sub.key)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._subs[sub.key]
            self._update_position(sub.key)

    async def _nudge(self) -> None:
        pipe = self._redis.pipeline(transaction=False)
        pipe.xadd(self._control, {"n": "1"}, maxlen=16, approximate=True)
        pipe.expire(self._control, 3600)
        await pipe.execute()

    def _update_position(self, key: str) -> None:
        subs = self._subs.get(key)
        if not subs:
            if self._pos.pop(key, None) is not None:
                del self._key_bulk[key], self._id_bulk[key]
            return
        lowest = next(iter(subs)) if len(subs) == 1 else min(subs, key=lambda s: s.last)
        if self._pos.get(key) != lowest.last:
            self._read_from(key, lowest)

    def _read_from(self, key: str, sub: Subscription) -> None:
        """The next read of ``key`` starts at ``sub``'s position."""
        if key not in self._pos:
            self._key_bulk[key] = _bulk(key)
        self._pos[key] = sub.last
        self._id_bulk[key] = _bulk(sub.last_id)

    def _command(self) -> bytes:
        """``XREAD COUNT c BLOCK ms STREAMS keys... ids...`` as RESP, ready to send.

        Packed here rather than by redis-py: with hundreds of streams the command
        is mostly keys and positions, and each is encoded once, when it changes,
        not on every read (most streams did not move since the last one).
        """
        head = b"*%d\r\n$5\r\nXREAD\r\n$5\r\nCOUNT\r\n%s$5\r\nBLOCK\r\n%s$7\r\nSTREAMS\r\n%s" % (
            8 + 2 * len(self._pos),
            _bulk(str(self._count)),
            _bulk(str(self._block_ms)),
            _bulk(self._control),
        )
        return b"".join(
            [head, *self._key_bulk.values(), _bulk(self._control_id), *self._id_bulk.values()]
        )

    async def _run(self) -> None:
        """Read every subscribed stream in one XREAD, again and again, on one connection.

        The connection is taken from the relay's pool once and kept: the command is
        written and its reply read directly (no per-read pool round trip, and the
        reply comes as Redis sends it, nested lists, without redis-py's per-entry
        dicts). On an error the connection is dropped and the next read opens one
        (through the Sentinels, when they are configured), after the backoff every
        retry in llmq uses (:func:`llmq.outage.backoff`). An outage is logged
        once when it starts and once when it ends, not on every retry.

        A read is one deadline, the connection's socket timeout, over sending the
        command and reading its reply, held by this loop: redis-py's own, while the
        connection is held here, would put a task and a timer around the send and
        another timer around the read, at every read.
        """
        pool = self._redis.connection_pool
        conn: Any = None
        deadline: float | None = None  # the socket timeout ``conn`` came with
        idle = True  # no command in flight on ``conn``
        outage = Outage(
            log,
            lost="relay lost Redis (%s); reconnecting",
            back="relay reconnected to Redis after %d failed attempts",
        )
        try:
            while not self._stopping:
                try:
                    if conn is None:
                        conn = await pool.get_connection()
                        deadline, conn.socket_timeout = conn.socket_timeout, None
                    # Where this read starts: a subscriber may move the live positions
                    # while it is in flight.
                    read_from = self._pos.copy()
                    idle = False
                    async with asyncio.timeout(deadline):
                        await conn.send_packed_command(self._command(), check_health=False)
                        reply = await conn.read_response()
                    idle = True
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    if conn is not None:
                        conn.socket_timeout = deadline
                        await _drop(pool, conn)
                        conn = None
                    await outage.failed(exc)
                    continue
                outage.recovered()
                if not reply:
                    continue
                for key, entries in reply:
                    if key == self._control:
                        self._control_id = entries[-1][0]
                    elif key in read_from:
                        self._dispatch(key, entries, read_from[key])
                # Let the subscribers relay what they just got before the next XREAD is
                # sent: their clients are waiting, the read is not.
                await asyncio.sleep(0)
        finally:
            if conn is not None:
                conn.socket_timeout = deadline
                if idle:
                    await pool.release(conn)
                else:  # cancelled mid-reply: the connection is not reusable
                    await _drop(pool, conn)

    def _dispatch(self, key: str, entries: list[list[Any]], read_from: StreamId) -> None:
        subs = self._subs.get(key)
        if not subs:
            return
        if len(subs) == 1:
            (sub,) = subs
            if sub.last == read_from:  # the usual case: every entry is new to it
                sub._take(
                    [(i, e) for i, fields in entries if (e := _entry_event(fields)) is not None],
                    entries[-1][0],
                )
                self._read_from(key, sub)
                return
        # A subscriber that joined while this read was in flight may want entries
        # from before ``read_from``: it is left for the next read, which starts at
        # its position, so it never skips anything.
        ready = [s for s in subs if s.last >= read_from]
        if not ready:
            return
        for stream_id, fields in entries:
            event = _entry_event(fields)
            parsed = parse_id(stream_id)
            for sub in ready:
                sub._offer(stream_id, parsed, event)
        self._update_position(key)


def _entry_event(fields: list[str]) -> Event | None:
    """The event a stream entry carries; None (logged) for one without ``data``."""
    raw = _data_field(fields) if fields else None
    if raw is None:
        log.warning("skipping stream entry without data: %r", fields)
        return None
    return decode_data(raw)


async def _drop(pool: Any, conn: Any) -> None:
    """Close a connection whose state is unknown and give its slot back to the pool."""
    with contextlib.suppress(Exception):
        await conn.disconnect()
    await pool.release(conn)
