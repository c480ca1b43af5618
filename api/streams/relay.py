"""One reader per API process relays every request stream to its waiting clients.

A blocked ``XREAD`` holds a Redis connection for its whole duration, so one per
client does not scale. The relay runs a single loop that reads all subscribed
streams in one ``XREAD`` and fans entries out to per-subscriber queues
(:class:`~api.streams.subscription.Subscription`). A new subscriber nudges the loop through
a tiny per-process control stream, so the blocked read returns at once and the
next one includes the new key.

The loop is on every token's path, so it does per read only what changed: the
position of each stream is kept up to date as entries arrive (not recomputed over
every subscriber), the command is packed from RESP kept per stream
(:mod:`api.streams.resp`), the reply is taken as Redis sends it (redis-py's per-entry dict
building is skipped), and token events, nearly all of what it reads, are decoded
on a fast path (:mod:`api.entries`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from redis.asyncio import Redis

from api.entries import entry_event
from api.streams.resp import bulk, xread
from api.streams.subscription import StreamId, Subscription, parse_id
from llmq.outage import Outage
from llmq.tasks import stop_tasks

log = logging.getLogger(__name__)


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
            await stop_tasks([self._nudger], timeout=2)
        if self._task:
            self._stopping = True
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):
                    await self._nudge()
            await asyncio.wait({self._task}, timeout=2)
            await stop_tasks([self._task], timeout=5)
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
            self._key_bulk[key] = bulk(key)
        self._pos[key] = sub.last
        self._id_bulk[key] = bulk(sub.last_id)

    def _command(self) -> bytes:
        """``XREAD COUNT c BLOCK ms STREAMS keys... ids...`` as RESP, ready to send.

        Packed here rather than by redis-py: with hundreds of streams the command
        is mostly keys and positions, and each is encoded once, when it changes,
        not on every read (most streams did not move since the last one).
        """
        return xread(
            self._count,
            self._block_ms,
            [bulk(self._control), *self._key_bulk.values()],
            [bulk(self._control_id), *self._id_bulk.values()],
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
                    [(i, e) for i, fields in entries if (e := entry_event(fields)) is not None],
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
            event = entry_event(fields)
            parsed = parse_id(stream_id)
            for sub in ready:
                sub._offer(stream_id, parsed, event)
        self._update_position(key)


async def _drop(pool: Any, conn: Any) -> None:
    """Close a connection whose state is unknown and give its slot back to the pool."""
    with contextlib.suppress(Exception):
        await conn.disconnect()
    await pool.release(conn)
