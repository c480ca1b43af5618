"""The control law: how many workers a model needs, from queueing, not from rules.

A worker has ``concurrency`` slots; a request holds one slot for its service time
``S`` (prefill + decode, measured from the cluster). By Little's law, requests
arriving at ``λ`` per second keep ``λ·S`` slots busy on average, so the load term
orders ``λ·S·(1 + headroom)`` slots. Requests already waiting need slots too:
each of the ``Q`` queued requests holds a slot for ``S``; draining them within
``T = max(slo_ttft, L + S)`` (no sooner than a new worker, with start-up time
``L``, can serve one) takes ``Q·S/T`` slots (at most one each), which the
headroom covers up to its size: ``slots = max(λ·S·(1 + headroom), λ·S + Q·S/T)``.
The slots running now are a floor (a busy worker is not stopped), not added: at
saturation running equals capacity, and adding it would grow on every queued
request. Desired workers = ``ceil(slots / concurrency)``.

Before any service time has been measured (a cold cluster, or scale from zero),
every request in the system gets a slot: ``running + queued``.

Feedback: if the observed TTFT p90 exceeds its objective while requests are still
queued and no ordered worker is still starting, one more worker is ordered than
is running (the model of ``S`` or ``λ`` was wrong; the measurement is the truth).
TPOT above its objective does the same (a backend slows down when its batch
grows). The measurements cover the last ``feedback_window`` seconds, so after
any upward action the feedback waits that long: until then it would still see
requests that waited for the capacity just ordered, and order again.

Dynamics:

- **Scale up at once**: a desired count above what is ordered (live + starting)
  is ordered in the same control period. Starting workers count as capacity on
  its way, so a slow start does not make the controller order again and again.
- **Scale down slowly**: the target falls only to the highest desired count of
  the last ``down_window`` seconds (HPA's stabilization window), and one worker
  per period, so a noisy or bursty load does not make it flap.
- **Bounds**: ``min_workers <= target <= max_workers``.
- **Scale to zero** (``min_workers == 0``): the last worker goes only after the
  model was idle (nothing queued or running, no arrivals) for ``idle_to_zero``
  seconds; the first queued request orders one worker (activation).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Literal, Protocol

Direction = Literal["up", "down", "none"]


@dataclass(frozen=True)
class LawSettings:
    min_workers: int
    max_workers: int
    slo_ttft_seconds: float
    slo_tpot_seconds: float
    headroom: float = 0.2
    down_window_seconds: float = 30.0
    idle_to_zero_seconds: float = 60.0
    startup_seconds: float = 5.0
    #: The latency measurements' window: after an upward action, the feedback waits
    #: this long, until what it measures was served by the new capacity.
    feedback_window_seconds: float = 10.0


@dataclass(frozen=True)
class Signals:
    """One model's state at one control period, as the cluster reports it."""

    queued: int
    running: int
    #: Requests per second entering the system (recent window).
    arrival_rate: float
    #: Mean time a request holds a slot (prefill + decode), None until measured.
    service_seconds: float | None
    #: Slots per worker.
    concurrency: int
    #: Live (registered) workers.
    ready: int
    #: Ordered workers that have not registered yet.
    starting: int = 0
    ttft_p90_seconds: float | None = None
    tpot_p90_seconds: float | None = None


@dataclass(frozen=True)
class Decision:
    #: Workers ordered after this decision (live + starting).
    target: int
    #: What the law wants now, before stabilization.
    desired: int
    direction: Direction
    reason: str


class Policy(Protocol):
    """What the controller needs of a decision rule (the law below, or a baseline's)."""

    settings: LawSettings

    def decide(self, s: Signals, now: float) -> Decision: ...


def wanted(settings: LawSettings, s: Signals, *, feedback: bool = True) -> tuple[int, str]:
    """Desired workers for ``s`` and the term that decided it (unbounded, unstabilized);
    ``feedback``: whether the latency measurements may add a worker."""
    S = s.service_seconds
    if S is None or S <= 0:
        slots = float(s.running + s.queued)
        reason = "backlog"
    else:
        offered = s.arrival_rate * S
        drain = max(settings.slo_ttft_seconds, settings.startup_seconds + S)
        backlog = min(s.queued * S / drain, float(s.queued))
        # the headroom absorbs a small backlog (the queue of a random arrival
        # process); only a backlog beyond it orders more. What runs now is a floor
        # (never stop a busy worker), not a reason to grow: at saturation running
        # equals capacity, and growing on it would chase noise.
        steady = max(offered * (1 + settings.headroom), float(s.running))
        slots = max(steady, offered + backlog)
        reason = "backlog" if offered + backlog > steady else "load"
    workers = math.ceil(slots / max(s.concurrency, 1) - 1e-9)
    ordered = s.ready + s.starting
    if feedback and s.starting == 0 and s.ready > 0:
        if (
            s.queued > 0
            and s.ttft_p90_seconds is not None
            and s.ttft_p90_seconds > settings.slo_ttft_seconds
            and workers <= ordered
        ):
            return ordered + 1, "slo_ttft"
        if (
            s.tpot_p90_seconds is not None
            and s.tpot_p90_seconds > settings.slo_tpot_seconds
            and s.running + s.queued > 0
            and workers <= ordered
        ):
            return ordered + 1, "slo_tpot"
    return workers, reason


class ControlLaw:
    """The law with its memory: the desired counts of the scale-down window, idle time."""

    def __init__(self, settings: LawSettings) -> None:
        self.settings = settings
        self._history: deque[tuple[float, int]] = deque()
        self._since: float | None = None
        self._idle_since: float | None = None
        self._last_up = -math.inf

    def _idle_or_activation(
        self, s: Signals, now: float, desired: int, reason: str
    ) -> tuple[int, str]:
        """Keep one worker until the model was idle long enough; wake one for a queued request."""
        busy = s.queued + s.running > 0 or s.arrival_rate > 0
        if busy:
            self._idle_since = None
        elif self._idle_since is None:
            self._idle_since = now
        idle_for = 0.0 if self._idle_since is None else now - self._idle_since
        if desired == 0:
            kept = s.ready + s.starting > 0
            if kept and (busy or idle_for < self.settings.idle_to_zero_seconds):
                return 1, "idle"
            return 0, "idle"
        if s.ready + s.starting == 0 and s.queued > 0:
            return desired, "activation"
        return desired, reason

    def decide(self, s: Signals, now: float) -> Decision:
        cfg = self.settings
        if self._since is None:
            self._since = now
        ordered = s.ready + s.starting
        feedback = now - self._last_up >= cfg.feedback_window_seconds
        desired, reason = wanted(cfg, s, feedback=feedback)

        desired, reason = self._idle_or_activation(s, now, desired, reason)
        bounded = min(max(desired, cfg.min_workers), cfg.max_workers)
        if bounded != desired:
            desired, reason = bounded, "bounds"

        self._history.append((now, desired))
        while self._history and now - self._history[0][0] > cfg.down_window_seconds:
            self._history.popleft()

        if desired > ordered:
            self._last_up = now
            return Decision(desired, desired, "up", reason)
        if ordered > cfg.max_workers:
            return Decision(ordered - 1, desired, "down", "bounds")
        if desired < ordered:
            window_full = now - self._since >= cfg.down_window_seconds
            stable = max(d for _, d in self._history)
            if window_full and stable < ordered and s.starting == 0:
                return Decision(ordered - 1, desired, "down", reason)
        return Decision(ordered, desired, "none", reason)
