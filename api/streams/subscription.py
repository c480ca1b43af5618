"""A client's side of the relay: the entries of one stream after an id, in order.

A :class:`Subscription` is what a relay (:mod:`api.streams.relay`, or
:mod:`api.streams.grouped_relay` on a Redis Cluster) fills and a response
(:mod:`api.streams.follow`) drains. Its queue is
bounded by construction: it only ever holds entries of one stream, which is capped
at ``stream_maxlen`` entries. A subscriber takes everything that arrived for it at
once (:meth:`Subscription.batch`), and waits under one keep-alive timer that stays
armed across its waits. Stream ids are parsed once (:func:`parse_id`), so that the
relay's loop compares positions as tuples.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from llmq.schema import Event

StreamId = tuple[int, int]


def parse_id(stream_id: str) -> StreamId:
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)


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
