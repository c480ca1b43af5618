"""The control law: how many workers a model needs, from queueing, not from rules.

A worker has ``concurrency`` slots; a request holds one slot for its service time
``S`` (prefill + decode, measured from the cluster). By Little's law, requests
arriving at ``λ`` per second keep ``λ·S`` slots busy on average.

**Load** (``λ`` over a long window, 10 s): the target is ``λ·S·(1 + headroom)``
slots. It scales *up* only when ``λ·S·(1 + headroom - dead_band)`` exceeds the
slots ordered, and *down* only when ``λ·S·(1 + headroom + dead_band)`` fits in
fewer workers: between the two is a dead band, so the noise of a measured rate at
a steady load (a 10 s count at 5.6 req/s is ±13 %) neither orders a worker that the
next window takes back nor stops one the next window orders again.

**Backlog** (the fast path of a step): ``Q`` requests are queued. New workers
arrive only after the start-up time ``L``; meanwhile the queue grows by what
arrives beyond the live capacity. The arrival rate for that projection is the
recent one (``λ_recent``, a 2 s window, when it is above ``λ``): a rising rate
shows there first, so the trend is projected over the start-up instead of the
long mean:

    Q_L   = Q + max(λ_recent·S - live_slots, 0) / S · L     backlog when they arrive
    W     = Q_L·S / live_slots                              its last request's wait
    B     = slo_ttft - S                                    the wait budget
    slots = 0 if W <= B, else max(λ_recent·S, Q_L·S / B)

**Burst filter** (``W <= B``): the queue is FIFO, so the request that arrives when
new workers could (``L`` from now) starts after the ``Q_L`` ahead of it, which the
live slots serve at ``live_slots/S`` per second. If that wait is within the budget
``B = slo_ttft - S`` (one service time kept for the prefill and a period's
lateness), the live workers absorb the queue within the objective and a worker
ordered now would only arrive to an empty queue: a burst orders nothing. A step
orders at once, as its projected wait is many times the budget (a 10x step on one
worker: ``W`` ≈ 20 s against 5 s).

**FIFO sizing** (``Q_L·S / B``): the same argument sizes the order. With ``C`` slots
once the workers arrive, the request at position ``k`` starts ``k·S / C`` later;
the oldest were queued longest but start first, so the last of ``Q_L``, queued
just then, is the one to bound: ``Q_L·S / C <= B``. Requests arriving afterwards
queue behind a backlog that shrinks while ``C > λ·S``, so they wait less. Serving
the whole backlog at once on top of the rate (``λ·S + Q_L·S / (slo - L)``) orders
about twice the load's count on a step, and those extra workers cost their
start-up and drain for a queue that order alone already serves in time. Where
``Q_L·S / B`` is above the load, the overshoot is not kept: the scale-down window
remembers only the load term, so once the backlog is served the target falls back
to the load in one worker per period. The slots running now
are a floor (a busy worker is not stopped), not a term.

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
- **Scale down slowly**: the target falls only to the highest load-term count of
  the last ``down_window`` seconds (HPA's stabilization window), one worker per
  period, never while a worker is starting, so a noisy or bursty load does not
  make it flap.
- **Window cut**: the window guards against noise, not against a drop that is
  beyond doubt. When the queue is empty (the backlog is served), the window keeps
  no more than the load count at an upper bound of the rate over the last
  ``cut_window`` (5 s: a quiet spell shorter than a start-up plus a period or two
  is not acted on): its count ``n`` plus ``z = 3`` Poisson standard deviations,
  ``(n + z²/2 + z·sqrt(n + z²/4)) / w``, if that count is at most half the workers
  ordered (a drop, not noise: the 10 s rate that ordered them is itself noisy, and
  a window kept at its noisy highs is what holds a steady load). After a 10x drop
  the count falls within seconds instead of the window plus the 10 s rate's lag;
  at a steady load the bound stays far above that (cutting 4 workers of 2 slots
  to 2 at 5.6 req/s needs at most 3 arrivals in 5 s where 28 are expected).
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
    #: The load term scales up only above ``headroom - dead_band`` (0: no dead band).
    dead_band: float = 0.15
    down_window_seconds: float = 30.0
    idle_to_zero_seconds: float = 60.0
    startup_seconds: float = 5.0
    #: The latency measurements' window: after an upward action, the feedback waits
    #: this long, until what it measures was served by the new capacity.
    feedback_window_seconds: float = 10.0
    #: Project the backlog over the start-up at the recent arrival rate and drain it
    #: within the objective (False: drain it within ``max(slo, L + S)``, no projection).
    project_backlog: bool = True
    #: A backlog orders workers only if the live ones would keep a request past the
    #: wait budget (False: any queue as long as the live slots with the recent rate
    #: above them orders, so every burst does).
    burst_filter: bool = True
    #: Once the queue is empty, the scale-down window keeps no more than the recent
    #: arrivals can need (False: the window always keeps its highest load count).
    window_cut: bool = True
    #: Size a backlog's order so its last request starts within the wait budget, the
    #: queue served in order (False: serve it within ``slo - L`` on top of the rate).
    fifo_drain: bool = True
    #: Standard deviations of the recent count's upper bound (the window cut).
    cut_z: float = 3.0
    #: The window of that count: a quiet spell shorter than it (a worker's start-up
    #: plus a period or so) is not a drop.
    cut_window_seconds: float = 5.0


@dataclass(frozen=True)
class Signals:
    """One model's state at one control period, as the cluster reports it."""

    queued: int
    running: int
    #: Requests per second entering the system (long window).
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
    #: Requests per second over the last few seconds (None: as ``arrival_rate``).
    arrival_rate_recent: float | None = None
    #: Arrivals counted over the last ``cut_window_seconds`` (or less, early on) and
    #: the seconds they were counted over; None: not counted.
    arrivals_counted: tuple[int, float] | None = None


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


def _workers(slots: float, concurrency: int) -> int:
    return math.ceil(slots / max(concurrency, 1) - 1e-9)


def load_workers(settings: LawSettings, s: Signals) -> int:
    """Workers the load keeps from a scale-down: its target with the headroom plus the
    dead band (the band's other side), and what the scale-down window remembers (a
    backlog's overshoot is not kept)."""
    if s.service_seconds is None or s.service_seconds <= 0:
        return _workers(float(s.running + s.queued), s.concurrency)
    kept = s.arrival_rate * s.service_seconds * (1 + settings.headroom + settings.dead_band)
    return _workers(kept, s.concurrency)


def wait_budget(settings: LawSettings, S: float) -> float:
    """The longest a queued request may wait for a slot: the TTFT objective less one
    service time (its prefill, and a control period's lateness)."""
    return max(settings.slo_ttft_seconds - S, S)


def backlog_slots(settings: LawSettings, s: Signals, S: float) -> float:
    """Slots that serve the queue within the objective, 0 if the live workers do."""
    if s.queued <= 0:
        return 0.0
    live = float(s.ready * s.concurrency)
    recent = s.arrival_rate if s.arrival_rate_recent is None else s.arrival_rate_recent
    L = settings.startup_seconds
    rate = max(s.arrival_rate, recent)
    at_arrival = s.queued + max(rate * S - live, 0.0) / S * L
    if settings.project_backlog and settings.burst_filter:
        # FIFO: the request that arrives when new workers could, L from now, starts
        # after the whole queue ahead of it, at live/S per second; if that is within
        # the budget, the live workers absorb the burst and nothing is ordered
        if live > 0 and at_arrival * S / live <= wait_budget(settings, S):
            return 0.0
    else:
        spare = live - s.arrival_rate * S
        # a step: the recent rate is beyond what is live and a queue as long as the
        # live slots stands (the recent rate alone is too noisy to act on)
        saturated = settings.project_backlog and recent * S > live and s.queued >= max(live, 1)
        if not saturated and spare > 0 and s.queued * S / spare <= settings.slo_ttft_seconds:
            return 0.0
    if not settings.project_backlog:
        drain = max(settings.slo_ttft_seconds, L + S)
        return s.arrival_rate * S + min(s.queued * S / drain, float(s.queued))
    if settings.fifo_drain:
        return max(rate * S, at_arrival * S / wait_budget(settings, S))
    drain = max(settings.slo_ttft_seconds - L, S)
    return rate * S + min(at_arrival * S / drain, at_arrival)


def recent_workers(settings: LawSettings, s: Signals) -> int | None:
    """The most workers the recent arrivals can need (None: unknown): the load count at
    an upper bound of the rate over the cut's window, ``cut_z`` standard deviations
    above its count (Poisson), so a quiet moment of a steady or bursty load does not
    read as a drop (a short count gives a wide bound)."""
    if s.arrivals_counted is None or s.service_seconds is None or s.service_seconds <= 0:
        return None
    n, w = s.arrivals_counted
    if w <= 0:
        return None
    z = settings.cut_z
    upper = (n + z * z / 2 + z * math.sqrt(n + z * z / 4)) / w
    kept = upper * s.service_seconds * (1 + settings.headroom + settings.dead_band)
    return _workers(kept, s.concurrency)


def wanted(
    settings: LawSettings, s: Signals, ordered: int | None = None, *, feedback: bool = True
) -> tuple[int, str]:
    """Desired workers for ``s`` and the term that decided it (unbounded, unstabilized);
    ``ordered``: workers ordered now (default ready + starting), for the dead band;
    ``feedback``: whether the latency measurements may add a worker."""
    S = s.service_seconds
    if ordered is None:
        ordered = s.ready + s.starting
    if S is None or S <= 0:
        workers, reason = _workers(float(s.running + s.queued), s.concurrency), "backlog"
    else:
        offered = s.arrival_rate * S
        load = _workers(offered * (1 + settings.headroom), s.concurrency)
        trigger = _workers(offered * (1 + settings.headroom - settings.dead_band), s.concurrency)
        if load > ordered and trigger <= ordered:
            load = ordered  # inside the dead band: hold
        floor = _workers(float(s.running), s.concurrency)
        backlog = _workers(backlog_slots(settings, s, S), s.concurrency)
        workers = max(load, floor, backlog)
        reason = "backlog" if backlog > max(load, floor) else "load"
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
    """The law with its memory: the load counts of the scale-down window, idle time."""

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

    def _bounded(self, desired: int) -> int:
        return min(max(desired, self.settings.min_workers), self.settings.max_workers)

    def decide(self, s: Signals, now: float) -> Decision:
        cfg = self.settings
        if self._since is None:
            self._since = now
        ordered = s.ready + s.starting
        feedback = now - self._last_up >= cfg.feedback_window_seconds
        desired, reason = wanted(cfg, s, ordered, feedback=feedback)

        desired, reason = self._idle_or_activation(s, now, desired, reason)
        # the window remembers the load, not a backlog's overshoot or a busy floor
        remembered = load_workers(cfg, s) if reason in ("backlog", "load") else desired
        self._history.append((now, self._bounded(remembered)))
        bounded = self._bounded(desired)
        if bounded != desired:
            desired, reason = bounded, "bounds"
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
            recent = recent_workers(cfg, s)
            if cfg.window_cut and s.queued == 0 and recent is not None and 2 * recent <= ordered:
                # the backlog is served and the recent arrivals, even at their upper
                # bound, need half the workers or fewer: a drop, not noise; the
                # window's older, higher counts are refuted
                stable = min(stable, max(recent, cfg.min_workers))
            if window_full and stable < ordered and s.starting == 0:
                return Decision(ordered - 1, desired, "down", reason)
        return Decision(ordered, desired, "none", reason)
