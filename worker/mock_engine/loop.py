"""The engine's clock: runs the scheduler's steps on an event loop, one timer for all.

A step takes ``step_seconds`` plus ``prefill_token_seconds`` per prompt token and
``decode_token_seconds`` per decode token it computes (:class:`StepCosts`); its
tokens come out when it ends, and the next step starts at once while anything
runs. Deadlines are absolute: the next step starts when the previous one was due to
end, not when its timer fired, so a busy event loop does not stretch the token
times cumulatively (a late step's successors follow at once until the backlog is
out). A sequence that arrives while a step runs joins the next one, as in any
continuous-batching engine.

Each step wakes the loop once and emits one token for every sequence that sampled
one, instead of one timer and one task wake-up per token per sequence.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from llmq.model.interface import CacheListener, Emit, Output, Report
from worker.mock_engine.kv_cache import KVCache
from worker.mock_engine.scheduler import EngineSequence, Scheduler, Step

log = logging.getLogger(__name__)

#: Event loop timers fire up to about a millisecond early or late (uvloop counts in
#: milliseconds): a timer this close to its deadline counts as on time.
TIMER_RESOLUTION = 0.001


@dataclass(frozen=True)
class StepCosts:
    """What a step costs: a base (reading the weights once), plus per token computed."""

    step_seconds: float
    prefill_token_seconds: float = 0.0
    decode_token_seconds: float = 0.0

    def of(self, step: Step) -> float:
        return (
            self.step_seconds
            + step.prefill_tokens * self.prefill_token_seconds
            + step.decode_tokens * self.decode_token_seconds
        )


class Running:
    """One sequence's outputs: the next one, already drawn, and where outputs go.

    ``outputs`` is drawn lazily, one token per step, so that a sequence that stops by
    itself ends right after its last token. Outputs that take no time (a tool call's
    start, a report) are emitted as soon as they are drawn.
    """

    __slots__ = ("emit", "finished", "next", "outputs", "state")

    def __init__(
        self,
        outputs: Iterator[Output],
        emit: Emit,
        finished: asyncio.Future[None],
        state: EngineSequence,
    ) -> None:
        self.outputs, self.emit, self.finished, self.state = outputs, emit, finished, state
        self.next: str | None = None

    def advance(self) -> bool:
        """Draw the next output; False (and finished) when there is none."""
        try:
            for out in self.outputs:
                if not isinstance(out, str):  # a tool call's start, a report
                    if not self.send(out):
                        return False
                    continue
                self.next = out
                return True
        except Exception as exc:
            return self.end(exc)
        return self.end(None)

    def step(self) -> bool:
        """Emit the token sampled now and draw the next; False once the sequence is over
        (cancelled, ended, or its consumer raised)."""
        if self.finished.done() or self.next is None:
            return False
        out, self.next = self.next, None
        try:  # send, inline: this runs once per token of every sequence
            self.emit(out)
        except Exception as exc:
            return self.end(exc)
        return not self.finished.done() and self.advance()

    def send(self, out: Output) -> bool:
        try:
            self.emit(out)
        except Exception as exc:
            return self.end(exc)
        return not self.finished.done()

    def end(self, exc: BaseException | None) -> bool:
        if not self.finished.done():
            if exc is None:
                self.finished.set_result(None)
            else:
                self.finished.set_exception(exc)
        return False


class EngineLoop:
    """A :class:`Scheduler` timed on one event loop; ``listeners`` hear the cache's news."""

    def __init__(
        self,
        scheduler: Scheduler,
        costs: StepCosts,
        listeners: list[CacheListener],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.scheduler, self.costs, self.listeners, self._loop = scheduler, costs, listeners, loop
        self._owners: dict[EngineSequence, Running] = {}
        #: The step under way (None: idle) and when it is due to end (loop time).
        self._step: Step | None = None
        self._step_end = 0.0
        self._waking = False
        self._from_idle = False

    @property
    def cache(self) -> KVCache:
        return self.scheduler.cache

    def add(self, running: Running) -> None:
        """Queue a sequence; its ``finished`` future is done when it ends (cancel it to
        stop it: it leaves the batch at the next step, and its blocks go back)."""
        if not running.advance():
            return
        state = running.state
        self._owners[state] = running
        running.finished.add_done_callback(lambda _: self._drop(state))
        self.scheduler.add(state)
        if self._step is None and not self._waking:
            # From idle, the first step starts once the loop has run what is ready now
            # (the caller's own work): a start-up that keeps the loop busy delays the
            # first token, instead of making the tokens after it catch up in a burst.
            self._waking = True
            self._loop.call_soon(self._wake)

    def _wake(self) -> None:
        self._waking = False
        if self._step is None:
            self._from_idle = True
            self._start(self._loop.time())

    def _drop(self, state: EngineSequence) -> None:
        self._owners.pop(state, None)
        self.scheduler.remove(state)

    def _start(self, at: float) -> None:
        """Schedule the next step from ``at`` (the previous one's due end, or now)."""
        step = self.scheduler.schedule()
        self._fail(step)
        for state in step.admitted:
            # Only a hit is reported: no report means none (consumers that count every
            # output as a token stay right for every prompt the cache does not know).
            owner = self._owners.get(state)
            if not state.cached_tokens or owner is None:
                continue
            if not owner.send(Report(cached_tokens=state.cached_tokens)):
                self._drop(state)
        self._publish()
        if not step.work:
            self._step = None
            return
        self._step = step
        self._step_end = at + self.costs.of(step)
        self._loop.call_at(self._step_end - TIMER_RESOLUTION, self._end_step, step)

    def _fail(self, step: Step) -> None:
        for state, problem in step.failed:
            owner = self._owners.pop(state, None)
            if owner is not None:
                owner.end(problem)

    def _end_step(self, step: Step) -> None:
        owners = self._owners
        for state in self.scheduler.complete(step):
            owner = owners.get(state)
            if owner is not None and not owner.step():
                self._drop(state)  # ended: its blocks go back before the next step
        # Late (a busy loop): the next step starts at once, as if this one were on time;
        # but a first step from idle that was late (a start-up keeping the loop busy)
        # delays its sequences' first token only, not their rhythm after it.
        backlog = 0.0 if self._from_idle else _MAX_BACKLOG
        self._from_idle = False
        self._start(max(self._step_end, self._loop.time() - backlog))

    def _publish(self) -> None:
        stored, evicted = self.cache.take_events()
        if stored or evicted:
            for listener in self.listeners:
                try:
                    listener(stored, evicted)
                except Exception:  # a listener's bug must not stop the engine's steps
                    log.exception("a KV cache listener failed")


#: How far behind the clock the steps may fall and still catch up (a loop blocked for
#: longer does not make the engine burst through the steps it missed).
_MAX_BACKLOG = 1.0
