"""Running one request: the model's tokens become events on the request's stream.

The runner publishes ``started``, then ``tokens`` (coalesced by the publisher),
then exactly one terminal event (``done`` or ``error``), updating the request's
record alongside the events that change its status.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from llmq.schema import (
    DoneEvent,
    ErrorEvent,
    FinishReason,
    JobPayload,
    StartedEvent,
    Timings,
    Usage,
)
from worker.model import GenerationRequest, Model, seed_for
from worker.publisher import StreamPublisher

log = logging.getLogger(__name__)


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


@dataclass
class RequestRunner:
    """Runs requests for one worker process; ``running`` counts what it runs now."""

    worker_id: str
    model: Model
    publisher: StreamPublisher
    running: dict[str, float] = field(default_factory=dict)

    async def run(self, payload: JobPayload, attempt: int) -> None:
        rid = payload.request_id
        started = time.time()
        self.running[rid] = started
        try:
            await self._run(payload, attempt, started)
        finally:
            self.running.pop(rid, None)

    async def _run(self, payload: JobPayload, attempt: int, started: float) -> None:
        rid = payload.request_id
        queue_ms = _ms(max(0.0, started - payload.enqueued_at))
        await self.publisher.emit(
            rid,
            StartedEvent(worker=self.worker_id, attempt=attempt, queue_ms=queue_ms),
            record={
                "status": "running",
                "started_at": str(started),
                "worker": self.worker_id,
                "attempts": str(attempt),
            },
        )
        params = payload.params
        request = GenerationRequest(
            prompt=payload.prompt,
            max_tokens=params.max_tokens,
            seed=seed_for(rid, params.seed),
            prompt_tokens=payload.prompt_tokens,
            stop=params.stop,
            temperature=params.temperature,
        )
        produced = 0
        first_at: float | None = None
        try:
            async for token in self.model.generate(request):
                if first_at is None:
                    first_at = time.time()
                self.publisher.token(rid, produced, token)
                produced += 1
        except Exception as exc:
            log.exception("model failed on request %s", rid, extra={"request_id": rid})
            await self._finish_error(payload, produced, "model_error", f"model failed: {exc}")
            return
        finish: FinishReason = "length" if produced >= params.max_tokens else "stop"
        await self._finish_done(payload, produced, finish, queue_ms, started, first_at)

    async def _finish_done(
        self,
        payload: JobPayload,
        produced: int,
        finish: FinishReason,
        queue_ms: float,
        started: float,
        first_at: float | None,
    ) -> None:
        now = time.time()
        first = first_at if first_at is not None else now
        event = DoneEvent(
            finish_reason=finish,
            usage=_usage(payload, produced),
            timings=Timings(
                queue_ms=queue_ms, prefill_ms=_ms(first - started), decode_ms=_ms(now - first)
            ),
        )
        status = "cancelled" if finish == "cancelled" else "done"
        await self.publisher.emit(
            payload.request_id,
            event,
            record={
                "status": status,
                "finished_at": str(now),
                "finish_reason": finish,
                "completion_tokens": str(produced),
            },
        )

    async def _finish_error(
        self, payload: JobPayload, produced: int, code: str, message: str
    ) -> None:
        await self.publisher.emit(
            payload.request_id,
            ErrorEvent(code=code, message=message, usage=_usage(payload, produced)),
            record={
                "status": "failed",
                "finished_at": str(time.time()),
                "finish_reason": "error",
                "completion_tokens": str(produced),
                "error": message,
            },
        )

    async def fail(self, request_id: str, code: str, message: str) -> None:
        """Publish a terminal error for a request the runner could not start."""
        await self.publisher.emit(
            request_id,
            ErrorEvent(code=code, message=message),
            record={
                "status": "failed",
                "finished_at": str(time.time()),
                "finish_reason": "error",
                "error": message,
            },
        )


def _usage(payload: JobPayload, produced: int) -> Usage:
    return Usage(
        prompt_tokens=payload.prompt_tokens,
        completion_tokens=produced,
        total_tokens=payload.prompt_tokens + produced,
    )
