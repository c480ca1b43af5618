"""Batched, fenced writes of stream events: one round trip per flush for every stream.

A worker process runs many requests; writing each token with its own ``XADD``
round trip would cap throughput at a few thousand tokens per second. Instead,
events are queued per stream and one flusher task writes everything pending in one
round trip: one call of ``publish.lua`` that writes every request's events, record
fields and lifecycle notes (Redis's cost per script call, and the worker's per
command, are paid once per flush, not once per stream). While a flush is in
flight, new tokens pile up and the next flush coalesces consecutive tokens of a
stream into one ``tokens`` event (up to ``max_event_tokens``). An idle publisher
flushes at once, so batching adds no latency at light load.

Every write carries the attempt that makes it (:meth:`StreamPublisher.own`); the
script refuses it if a later attempt owns the request, and the publisher then tells
the run (its ``on_fenced`` callback) and fails its waiters with :class:`Fenced`.

Nothing is dropped: a flush that fails because Redis is away keeps its batch, puts
it back in front of what arrived meanwhile (each stream's order holds) and is
retried with backoff until Redis answers, logged once per outage. The script makes
a retry idempotent (tokens below the stream's next index are skipped), so a flush
whose reply was lost never duplicates an index.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import hiredis
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from llmq.outage import Outage
from llmq.protocol.streams import Lifetimes, publish_calls, publish_script
from llmq.schema import Event, Lifecycle, TokenLogprob, tokens_event
from llmq.tasks import stop_tasks

log = logging.getLogger(__name__)

#: Failures a flush survives by keeping its batch and retrying.
RETRYABLE = (RedisConnectionError, RedisTimeoutError, OSError)

OnFenced = Callable[[str], None]


class Fenced(Exception):
    """The write was refused: a later attempt owns the request."""


@dataclass(slots=True)
class _Pending:
    #: The attempt that queued these writes (0: unfenced).
    attempt: int
    events: list[Event] = field(default_factory=list)
    tokens_start: int = 0
    tokens: list[str] = field(default_factory=list)
    #: One per token when the request asked for log-probabilities, else empty.
    logprobs: list[TokenLogprob] = field(default_factory=list)
    waiters: list[asyncio.Future[None]] = field(default_factory=list)
    record: dict[str, str] = field(default_factory=dict)
    notes: list[Lifecycle] = field(default_factory=list)

    def close_tokens(self) -> None:
        if self.tokens:
            logprobs = self.logprobs if len(self.logprobs) == len(self.tokens) else None
            self.events.append(tokens_event(self.tokens_start, self.tokens, logprobs))
            self.tokens, self.logprobs = [], []

    def then(self, later: _Pending) -> None:
        """Append what was queued after this batch (this batch failed to land)."""
        self.close_tokens()
        self.events.extend(later.events)
        self.tokens_start, self.tokens = later.tokens_start, later.tokens
        self.logprobs = later.logprobs
        self.waiters.extend(later.waiters)
        self.record.update(later.record)
        self.notes.extend(later.notes)


class StreamPublisher:
    """Owns the flusher task; ``start`` and ``stop`` bracket its life."""

    def __init__(
        self,
        redis: Redis,
        *,
        maxlen: int,
        ttl_seconds: int,
        max_event_tokens: int,
        lifecycle_maxlen: int = 100_000,
        lifetimes: Callable[[], Lifetimes] | None = None,
    ):
        """``lifetimes``: the pool policy's lifetimes as they are now (the live
        policy's pool), read once per flush; None: ``ttl_seconds``, ``maxlen`` and
        ``lifecycle_maxlen`` hold."""
        self._redis = redis
        self._lifetimes = lifetimes
        self._script = publish_script(redis)
        self._lifecycle_maxlen = lifecycle_maxlen
        self._maxlen = maxlen
        self._ttl = ttl_seconds
        self._max_event_tokens = max_event_tokens
        self._pending: dict[str, _Pending] = {}
        #: The batch being written (see :meth:`written`).
        self._in_flight: dict[str, _Pending] = {}
        self._owners: dict[str, tuple[int, OnFenced | None]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: One outage for the flusher and the last writes of :meth:`stop`. Its
        #: backoff is faster than the shared one (at most 0.1 s): it bounds how long
        #: tokens stall after Redis comes back.
        self._outage = Outage(
            log,
            lost="stream writes failed (%s); keeping them and retrying",
            back="stream writes landed after %d failed attempts",
            schedule=ExponentialBackoff(cap=0.1, base=0.01),
        )
        #: The connection flushes are written on (single Redis), between flushes too.
        self._connection: AbstractConnection | None = None

    @property
    def redis(self) -> Redis:
        """The client the publisher writes with (a re-run reads its stream back with it)."""
        return self._redis

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="stream-publisher")

    async def stop(self, timeout: float = 5.0) -> None:
        """Stop the flusher, then write what is still pending, retrying for up to
        ``timeout`` seconds (Redis may be away); what cannot land then is logged."""
        if self._task:
            await stop_tasks([self._task], timeout=5)
            self._task = None
        try:
            await self._flush_until(time.monotonic() + timeout)
        finally:
            await self._release()

    async def _flush_until(self, deadline: float) -> None:
        """Write what is pending, retrying until ``deadline``."""
        while True:
            try:
                await self._flush()
            except RETRYABLE as exc:
                if time.monotonic() >= deadline:
                    log.error(
                        "stopping with the writes of %d requests unwritten (%s); their "
                        "re-runs generate those tokens again",
                        len(self._pending),
                        exc,
                    )
                    return
                await self._outage.failed(exc)
                continue
            self._outage.recovered()
            return

    def own(self, request_id: str, attempt: int, on_fenced: OnFenced | None = None) -> None:
        """Writes queued for ``request_id`` from now on are made as ``attempt``;
        ``on_fenced(request_id)`` is called if the script refuses one."""
        self._owners[request_id] = (attempt, on_fenced)

    def disown(self, request_id: str) -> None:
        """The run ended: no more callbacks (writes still queued keep their attempt)."""
        self._owners.pop(request_id, None)

    def _queue(self, request_id: str) -> _Pending:
        p = self._pending.get(request_id)
        if p is None:
            owner = self._owners.get(request_id)
            p = self._pending[request_id] = _Pending(owner[0] if owner else 0)
        return p

    def token(
        self, request_id: str, index: int, token: str, logprob: TokenLogprob | None = None
    ) -> None:
        """Queue one token (and its log-probability); no round trip, no await."""
        p = self._queue(request_id)
        tokens = p.tokens
        if not tokens:
            p.tokens_start = index
        elif p.tokens_start + len(tokens) != index or len(tokens) >= self._max_event_tokens:
            p.close_tokens()
            p.tokens_start, tokens = index, p.tokens
        tokens.append(token)
        if logprob is not None:
            p.logprobs.append(logprob)
        self._wake.set()

    def note(self, lifecycle: Lifecycle) -> None:
        """Queue a lifecycle entry with its request's next write; no round trip of its own."""
        self._queue(lifecycle.request_id).notes.append(lifecycle)
        self._wake.set()

    async def emit(
        self, request_id: str, event: Event, record: dict[str, str] | None = None
    ) -> None:
        """Queue ``event`` after the stream's pending tokens and wait until it is written.

        ``record`` fields are written to the request's record in the same round trip.
        Raises :class:`Fenced` if a later attempt owns the request.
        """
        await self.post(request_id, event, record)

    def post(
        self,
        request_id: str,
        event: Event,
        record: dict[str, str] | None = None,
        *,
        flush: bool = True,
    ) -> asyncio.Future[None]:
        """:meth:`emit` without the wait: queued now, in order; the future says when written.

        ``flush`` False: written with the next flush, which another write or
        :meth:`flush_soon` starts, not at the loop's next turn."""
        p = self._queue(request_id)
        p.close_tokens()
        p.events.append(event)
        if record:
            p.record.update(record)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        p.waiters.append(done)
        if flush:
            self._wake.set()
        return done

    def flush_soon(self) -> None:
        """Write everything queued, at the loop's next turn."""
        self._wake.set()

    async def _run(self) -> None:
        while True:
            if not self._outage.failures:
                await self._wake.wait()
            self._wake.clear()
            try:
                await self._flush()
            except RETRYABLE as exc:
                await self._outage.failed(exc)
                continue
            except Exception:  # a bug, not an outage: its waiters were told
                log.exception("stream flush failed")
            self._outage.recovered()

    def written(self, request_id: str) -> asyncio.Future[None]:
        """Done once everything queued for ``request_id`` so far is written (at once if
        nothing is queued or in flight); it fails with :class:`Fenced` as those writes do.
        """
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if request_id not in self._pending and request_id not in self._in_flight:
            done.set_result(None)
        else:  # with the next write, behind the batch in flight: a stream's land in order
            self._queue(request_id).waiters.append(done)
            self._wake.set()
        return done

    async def _flush(self) -> None:
        if not self._pending:
            return
        batch, self._pending = self._pending, {}
        self._in_flight = batch
        try:
            written = await self._write(batch)
        except RETRYABLE:
            for request_id, later in self._pending.items():
                if request_id in batch:
                    batch[request_id].then(later)
                else:
                    batch[request_id] = later
            self._pending = batch
            raise
        except BaseException as exc:
            for p in batch.values():
                for w in p.waiters:
                    if not w.done():
                        w.set_exception(exc if isinstance(exc, Exception) else RuntimeError(exc))
            raise
        finally:
            self._in_flight = {}
        for (request_id, p), ok in zip(batch.items(), written, strict=True):
            if not ok:
                self._fenced(request_id, p)
                continue
            for w in p.waiters:
                if not w.done():
                    w.set_result(None)

    async def _write(self, batch: dict[str, _Pending]) -> list[bool]:
        """One round trip of ``publish.lua`` calls (one per flush on a single Redis);
        per request in ``batch``, True where its writes landed."""
        for p in batch.values():
            p.close_tokens()
        try:
            written = await self._round_trip(batch)
        except NoScriptError:  # Redis restarted without its script cache: nothing ran
            self._script.sha = await self._redis.script_load(self._script.script)
            written = await self._round_trip(batch)
        return [written[request_id] for request_id in batch]

    async def _round_trip(self, batch: dict[str, _Pending]) -> dict[str, bool]:
        """Send the batch's calls (:func:`publish_calls`: on a single Redis one per
        flush, on a Redis Cluster one per request group) in one round trip and read
        a reply to each; a request's failed write is raised once every reply is read.

        On a single Redis the calls are packed by hiredis (in C: redis-py's packing in
        Python cost more than the rest of a token's way) and sent on the publisher's
        connection: taken from the pool once and kept while flushes succeed (checking
        one out and in per flush cost a lock, a timer and a socket read each time),
        given back when a flush fails or the publisher stops. On a Redis Cluster they go
        through the cluster's pipeline, which sends each node the calls whose slots it owns.
        """
        cluster = isinstance(self._redis, RedisCluster)
        ttl, maxlen, lifecycle_maxlen = self._ttl, self._maxlen, self._lifecycle_maxlen
        if self._lifetimes is not None:  # once per flush: a change applies at the next
            now = self._lifetimes()
            ttl, maxlen = now.request_ttl_seconds, now.stream_maxlen
            lifecycle_maxlen = now.lifecycle_maxlen
        calls = publish_calls(
            self._script.sha,
            batch,
            ttl=ttl,
            maxlen=maxlen,
            lifecycle_maxlen=lifecycle_maxlen,
            by_slot=cluster,
        )
        replies: list[Any] = []
        if cluster:
            pipe = self._redis.pipeline(transaction=False)
            for command, _ in calls:
                pipe.evalsha(*command[1:])
            replies = list(await pipe.execute())
        else:
            connection = self._connection
            if connection is None:
                connection = self._connection = await self._redis.connection_pool.get_connection()
            try:
                await connection.send_packed_command(
                    b"".join(hiredis.pack_command(command) for command, _ in calls)
                )
                for _ in calls:
                    try:
                        replies.append(await connection.read_response())
                    except ResponseError as exc:  # the call itself failed (NOSCRIPT)
                        replies.append(exc)
            except BaseException:
                await self._release()  # a broken connection was disconnected
                raise
        written: dict[str, bool] = {}
        failed: ResponseError | None = None
        for (_, request_ids), reply in zip(calls, replies, strict=True):
            if isinstance(reply, ResponseError):
                raise reply
            for request_id, one in zip(request_ids, reply, strict=True):
                if isinstance(one, ResponseError):
                    failed = failed or one
                written[request_id] = one == 1
        if failed is not None:
            raise failed
        return written

    async def _release(self) -> None:
        """Give the publisher's connection back to the pool (the next flush takes one)."""
        connection, self._connection = self._connection, None
        if connection is not None:
            await self._redis.connection_pool.release(connection)

    def _fenced(self, request_id: str, p: _Pending) -> None:
        owner = self._owners.get(request_id)
        running = owner is not None and owner[0] <= p.attempt
        # A run that ended (e.g. handed back on a stop) leaving writes queued is normal.
        log.log(
            logging.WARNING if running else logging.INFO,
            "request %s: attempt %d is fenced off (a later attempt owns it); its writes "
            "are dropped",
            request_id,
            p.attempt,
            extra={"request_id": request_id},
        )
        for w in p.waiters:
            if not w.done():
                w.set_exception(Fenced(request_id))
        if running and owner is not None and owner[1] is not None:
            owner[1](request_id)
