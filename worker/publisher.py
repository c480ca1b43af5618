"""Batched writes of stream events: one pipeline per flush for every stream at once.

A worker process runs many requests; writing each token with its own ``XADD``
round trip would cap throughput at a few thousand tokens per second. Instead,
events are queued per stream and one flusher task writes everything pending in a
single pipeline. While a flush is in flight, new tokens pile up and the next
flush coalesces consecutive tokens of a stream into one ``tokens`` event (up to
``max_event_tokens``). An idle publisher flushes at once, so batching adds no
latency at light load.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from redis.asyncio import Redis

from llmq.schema import Event, Lifecycle, TokenLogprob, TokensEvent
from llmq.streams import add_event, add_lifecycle, add_record
from llmq.tasks import cancel_and_wait

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    events: list[Event] = field(default_factory=list)
    tokens_start: int = 0
    tokens: list[str] = field(default_factory=list)
    #: One per token when the request asked for log-probabilities, else empty.
    logprobs: list[TokenLogprob] = field(default_factory=list)
    waiters: list[asyncio.Future[None]] = field(default_factory=list)
    record: dict[str, str] = field(default_factory=dict)

    def close_tokens(self) -> None:
        if self.tokens:
            logprobs = self.logprobs if len(self.logprobs) == len(self.tokens) else None
            self.events.append(
                TokensEvent(index=self.tokens_start, tokens=self.tokens, logprobs=logprobs)
            )
            self.tokens, self.logprobs = [], []


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
    ):
        self._redis = redis
        self._lifecycle_maxlen = lifecycle_maxlen
        self._notes: list[Lifecycle] = []
        self._maxlen = maxlen
        self._ttl = ttl_seconds
        self._max_event_tokens = max_event_tokens
        self._pending: dict[str, _Pending] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def redis(self) -> Redis:
        """The client the publisher writes with (a re-run reads its stream back with it)."""
        return self._redis

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="stream-publisher")

    async def stop(self) -> None:
        if self._task:
            await cancel_and_wait([self._task], timeout=5)
            self._task = None
        await self._flush()

    def token(
        self, request_id: str, index: int, token: str, logprob: TokenLogprob | None = None
    ) -> None:
        """Queue one token (and its log-probability); no round trip, no await."""
        p = self._pending.setdefault(request_id, _Pending())
        if p.tokens and (
            p.tokens_start + len(p.tokens) != index or len(p.tokens) >= self._max_event_tokens
        ):
            p.close_tokens()
        if not p.tokens:
            p.tokens_start = index
        p.tokens.append(token)
        if logprob is not None:
            p.logprobs.append(logprob)
        self._wake.set()

    def note(self, lifecycle: Lifecycle) -> None:
        """Queue a lifecycle entry for the next flush; no round trip of its own."""
        self._notes.append(lifecycle)
        self._wake.set()

    async def emit(
        self, request_id: str, event: Event, record: dict[str, str] | None = None
    ) -> None:
        """Queue ``event`` after the stream's pending tokens and wait until it is written.

        ``record`` fields are written to the request's record in the same round trip.
        """
        await self.post(request_id, event, record)

    def post(
        self, request_id: str, event: Event, record: dict[str, str] | None = None
    ) -> asyncio.Future[None]:
        """:meth:`emit` without the wait: queued now, in order; the future says when written."""
        p = self._pending.setdefault(request_id, _Pending())
        p.close_tokens()
        p.events.append(event)
        if record:
            p.record.update(record)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        p.waiters.append(done)
        self._wake.set()
        return done

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self._flush()
            except Exception:  # the flusher must outlive a Redis hiccup
                log.exception("stream flush failed")
                await asyncio.sleep(0.1)

    async def _flush(self) -> None:
        if not self._pending and not self._notes:
            return
        batch, self._pending = self._pending, {}
        notes, self._notes = self._notes, []
        pipe = self._redis.pipeline(transaction=False)
        for note in notes:
            add_lifecycle(pipe, note, maxlen=self._lifecycle_maxlen)
        for request_id, p in batch.items():
            p.close_tokens()
            for event in p.events:
                add_event(pipe, request_id, event, maxlen=self._maxlen, ttl=self._ttl)
            if p.record:
                add_record(pipe, request_id, p.record, ttl=self._ttl)
        try:
            await pipe.execute()
        except BaseException as exc:
            for p in batch.values():
                for w in p.waiters:
                    if not w.done():
                        w.set_exception(exc if isinstance(exc, Exception) else RuntimeError(exc))
            raise
        for p in batch.values():
            for w in p.waiters:
                if not w.done():
                    w.set_result(None)
