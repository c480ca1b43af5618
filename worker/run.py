"""One run of a request on this worker: its progress and its status, in one object.

A :class:`Run` moves between the states of :class:`RunStatus` only by its methods
below, each of which says from which states it may move (as vLLM's scheduler keeps a
``Request`` with a ``RequestStatus``)::

    RUNNING ──pause_for_lease──▶ PAUSING ──resume──▶ RUNNING
       │  ╲                         │
       │   cancel ──▶ CANCELLED ◀── cancel
       │                 │
       ├─ hand_back ─────┴──────────┴──▶ HANDING_BACK
       ├─ finish (terminal event posted) ──▶ FINISHED
       ├─ stop_unfinished (ended without one) ──▶ UNFINISHED
       └─ fence (from any state but FENCED) ──▶ FENCED

A fenced run wins over every other state: it writes nothing more. A hand-back wins
over a cancel (the request goes back to the queue; the next attempt sees the cancel
flag). Moving to PAUSING, HANDING_BACK, CANCELLED or FENCED stops the model at once
(its generation task is cancelled); leaving PAUSING answers the run that waits on
the pause (:meth:`Run.wait_pause`): go on (True) or stop (False).
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field

from opentelemetry.trace import Span

from llmq.schema import FinishReason, JobPayload
from worker.leases import Held


class RunStatus(enum.Enum):
    #: The model generates, or the run starts or writes its outcome.
    RUNNING = "running"
    #: Stopped by this worker's lease clock (no renewal answered for a lease): waits
    #: for Redis's verdict on the lease (:meth:`Run.resume`, or fenced, or cancelled).
    PAUSING = "pausing"
    #: Stopped to go back to the queue (this worker's model cannot run it now).
    HANDING_BACK = "handing_back"
    #: Lost to another attempt: writes nothing more.
    FENCED = "fenced"
    #: The client cancelled: the run ends with ``done``/``cancelled``.
    CANCELLED = "cancelled"
    #: Its terminal event is posted: over, whatever happens to it now.
    FINISHED = "finished"
    #: Ended without a terminal event (arq's job timeout, or the runner raised): arq's
    #: finish says whether it is ended as this attempt or handed back.
    UNFINISHED = "unfinished"


#: The states in which a run's model may still be generating for it.
LIVE = frozenset({RunStatus.RUNNING, RunStatus.PAUSING, RunStatus.CANCELLED})


@dataclass
class Progress:
    """What a run produced so far and what it must stop by."""

    #: Tokens of the request so far, those of earlier runs included (the next index).
    produced: int = 0
    #: Tokens already published by earlier runs, which this run resumed after.
    resumed: int = 0
    #: When this run produced its first token, and its latest.
    first_at: float | None = None
    last_at: float = 0.0
    #: The job timeout's deadline for generating (loop time); None: no job timeout.
    deadline: float | None = None
    #: The generation stopped at the job timeout's deadline, not its own timeout.
    by_job_timeout: bool = False
    #: The tokens so far (resumed ones included), to resume a paused generation.
    texts: list[str] = field(default_factory=list)
    #: The generation's deadline (loop time), kept across a pause.
    generation_deadline: float | None = None
    #: What the backend reported (:class:`~llmq.model.interface.Report`): the prompt's
    #: token count by its own tokenizer, the cached part of it, why it stopped.
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: FinishReason | None = None


@dataclass(eq=False)
class Run:
    """One attempt of one request on this worker (see the module docstring)."""

    payload: JobPayload
    attempt: int
    #: When it started here (wall clock).
    started: float = 0.0
    progress: Progress = field(default_factory=Progress)
    status: RunStatus = RunStatus.RUNNING
    #: The model's task while it generates (None before and after).
    generation: asyncio.Task[FinishReason] | None = None
    #: Answered when a pause ends: True to go on, False to stop.
    pause: asyncio.Future[bool] | None = None
    #: Its lease as this worker last knew it held (None: no lease clock).
    lease: Held | None = None
    #: Stopped from outside (its task was cancelled), for an UNFINISHED run.
    interrupted: bool = False
    #: Its ``llmq.run`` span while tracing is on (:mod:`llmq.tracing`); None otherwise.
    span: Span | None = None

    @property
    def request_id(self) -> str:
        return self.payload.request_id

    def _move(self, to: RunStatus, allowed: frozenset[RunStatus] | set[RunStatus]) -> bool:
        if self.status not in allowed:
            return False
        if self.status is RunStatus.PAUSING and to is not RunStatus.PAUSING:
            self._answer_pause(to is RunStatus.RUNNING)
        self.status = to
        return True

    def _answer_pause(self, go_on: bool) -> None:
        if self.pause is not None and not self.pause.done():
            self.pause.set_result(go_on)

    def _stop_model(self) -> None:
        if self.generation is not None:
            self.generation.cancel()

    def pause_for_lease(self) -> bool:
        """RUNNING, with the model generating → PAUSING: the model stops at once."""
        if self.generation is None or self.pause is not None:
            return False
        if self.status is not RunStatus.RUNNING:
            return False
        self.status = RunStatus.PAUSING
        self.pause = asyncio.get_running_loop().create_future()
        self._stop_model()
        return True

    def resume(self) -> bool:
        """PAUSING → RUNNING: a renewal said the lease holds; the run generates again."""
        return self._move(RunStatus.RUNNING, {RunStatus.PAUSING})

    async def wait_pause(self) -> bool:
        """While PAUSING: wait for the verdict (True: go on); False if not paused."""
        if self.pause is None:
            return False
        try:
            return await self.pause
        finally:
            self.pause = None

    def cancel(self) -> bool:
        """RUNNING or PAUSING → CANCELLED, the model stopped; True if it was generating.
        (A run handed back, fenced or over stays so.)"""
        self._move(RunStatus.CANCELLED, {RunStatus.RUNNING, RunStatus.PAUSING})
        if self.status is not RunStatus.CANCELLED or self.generation is None:
            return False
        self._stop_model()
        return True

    def hand_back(self) -> bool:
        """RUNNING, PAUSING or CANCELLED, with the model generating → HANDING_BACK."""
        if self.generation is None or not self._move(RunStatus.HANDING_BACK, LIVE):
            return False
        self._stop_model()
        return True

    def fence(self) -> bool:
        """Any state but FENCED → FENCED: the model stops, nothing more is written."""
        if self.status is RunStatus.FENCED:
            return False
        self._move(RunStatus.FENCED, set(RunStatus))
        self._stop_model()
        return True

    def finish(self) -> None:
        """Its terminal event is posted → FINISHED; a fenced run stays fenced (the
        publisher refuses what it posts)."""
        self._move(RunStatus.FINISHED, set(RunStatus) - {RunStatus.FENCED, RunStatus.UNFINISHED})

    def stop_unfinished(self, *, interrupted: bool) -> bool:
        """Ended without a terminal event (not fenced, not over) → UNFINISHED."""
        moved = self._move(RunStatus.UNFINISHED, LIVE | {RunStatus.HANDING_BACK})
        if moved:
            self.interrupted = interrupted
        return moved

    @property
    def fenced(self) -> bool:
        return self.status is RunStatus.FENCED

    @property
    def over(self) -> bool:
        """Its terminal event is posted."""
        return self.status is RunStatus.FINISHED
