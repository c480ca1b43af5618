"""Autoscaling policies side by side, on the same traces and the same actuator.

Every policy drives the same local driver (``llmq worker`` processes under the
supervisor, started with a model load time, stopped with SIGTERM and their
drain) through the same controller loop (1 s period, the same cluster signals);
only the decision rule differs:

- ``static-peak`` / ``static-mean``: a fixed count, provisioned for the trace's
  peak or mean rate (``ceil(rate x S x 1.2 / concurrency)``);
- ``keda-queue``: the rule KEDA's redis trigger and the HPA apply,
  ``ceil(queued / target)`` with target = one worker's slots, polled every 5 s,
  scale-down to the highest recommendation of a 15 s window;
- ``ray-ongoing``: Ray Serve's rule, ``ceil(ongoing / target_ongoing_requests)``
  (ongoing = running + queued, averaged over 5 s, target 2), acting only after
  the decision held for ``upscale_delay`` 5 s / ``downscale_delay`` 15 s;
- ``llmq``: llmq's controller (:mod:`llmq.autoscale.law`), scale-down window 15 s.

KEDA's and Ray's delays are their defaults scaled down 6x (30 s -> 5 s) and the
scale-down windows are all 15 s, so that traces of a minute or two can show them
act; the benchmark compares rules, not default timings.

Every dynamic policy starts a trace at the count its first rate is provisioned
for (as a static one would), has the same 1..12 bounds, and every scale-in is a
SIGTERM and the worker's drain: a stream cut or errored by one shows as a failed
request. Worker-seconds count every worker process from its spawn to its exit,
loading and draining ones included.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import re
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, BinaryIO

from redis.asyncio import Redis

from bench import traffic
from bench.procs import clean_env
from bench.report import fmt, pct, table, target_line
from bench.scenario import Context, ScenarioResult, Target
from cli.local_driver import LocalDriver
from cli.supervisor import Child, Supervisor
from llmq import registry
from llmq.autoscale.controller import Controller
from llmq.autoscale.law import ControlLaw, Decision, Direction, LawSettings, Policy, Signals
from llmq.embedded import EmbeddedRedis, free_port
from llmq.schema import WorkerInfo
from llmq.settings import ControllerSettings

TTFT_SLO_MS = 6000.0
TPOT_SLO_MS = 100.0
#: Reversals are counted in the steady trace after this warm-up (the rate windows fill).
STEADY_SKIP_S = 10.0


@dataclass(frozen=True)
class Sizes(traffic.Requests):
    concurrency: int = 2
    output_tokens: int = 50  # S = 1 s
    prompt_tokens: int = 10
    load_seconds: float = 2.0
    max_workers: int = 12
    low: float = 1.2  # req/s
    high: float = 12.0  # the 10x step
    step_at: float = 10.0
    step_len: float = 15.0
    #: Low time after the step: the scale-down window plus a scale-in to the low count.
    tail: float = 35.0
    #: Swings (dynamic policies only): short 10x steps, each followed by a scale-in.
    swings: int = 2
    swing_at: float = 4.0
    swing_len: float = 8.0
    swing_gap: float = 24.0
    ramp_len: float = 20.0
    bursty_rate: float = 6.0
    burstiness: float = 0.25
    bursty_len: float = 24.0
    steady_rate: float = 5.6  # 70% of 4 workers' slots
    steady_len: float = 120.0
    down_window: float = 15.0

    @property
    def service_s(self) -> float:
        return self.output_tokens / self.tokens_per_second


QUICK = Sizes(
    step_at=4.0, step_len=6.0, tail=4.0, swings=1, swing_len=4.0, swing_gap=4.0,
    ramp_len=8.0, bursty_len=8.0,
    steady_len=14.0, down_window=4.0, high=6.0, low=0.6, bursty_rate=3.0, steady_rate=2.8,
)  # fmt: skip


@dataclass(frozen=True)
class Phase:
    offset: float
    rate: float
    duration: float
    burstiness: float = 1.0
    ramp: tuple[float, float] | None = None


@dataclass(frozen=True)
class Trace:
    name: str
    phases: tuple[Phase, ...]
    peak: float
    mean: float
    length: float
    #: When the steps happen (step trace only).
    steps_at: tuple[float, ...] = ()
    #: The rate it starts at (what the dynamic policies start provisioned for).
    start_rate: float = 0.0
    #: Run by the dynamic policies only (a static one has no scale-in to check).
    dynamic_only: bool = False


def _steps(name: str, s: Sizes, first: float, high: float, low: float, n: int) -> Trace:
    """``n`` 10x steps of ``high`` seconds from ``first`` on, each followed by ``low``."""
    total = first + n * (high + low)
    at = tuple(first + i * (high + low) for i in range(n))
    return Trace(
        name,
        (Phase(0.0, s.low, total), *(Phase(t, s.high - s.low, high) for t in at)),
        s.high,
        (s.low * total + (s.high - s.low) * high * n) / total,
        total,
        steps_at=at,
        start_rate=s.low,
        dynamic_only=name != "step",
    )


def traces(s: Sizes) -> list[Trace]:
    """The issue's four, and swings: the step again, short and repeated, so that the
    scale-ins are many and each is checked."""
    return [
        _steps("step", s, s.step_at, s.step_len, s.tail, 1),
        Trace(
            "ramp",
            (Phase(0.0, s.high, s.ramp_len, ramp=(s.low, s.high)),),
            s.high,
            (s.low + s.high) / 2,
            s.ramp_len,
            start_rate=s.low,
        ),
        Trace(
            "bursty",
            (Phase(0.0, s.bursty_rate, s.bursty_len, burstiness=s.burstiness),),
            s.bursty_rate * 2,
            s.bursty_rate,
            s.bursty_len,
            start_rate=s.bursty_rate,
        ),
        Trace("steady", (Phase(0.0, s.steady_rate, s.steady_len),), s.steady_rate,
              s.steady_rate, s.steady_len, start_rate=s.steady_rate),
        _steps("swings", s, s.swing_at, s.swing_len, s.swing_gap, s.swings),
    ]  # fmt: skip


def provision(rate: float, s: Sizes) -> int:
    return max(1, min(s.max_workers, math.ceil(rate * s.service_s * 1.2 / s.concurrency)))


class QueueRule:
    """KEDA's redis trigger through the HPA: ``ceil(queued / target)``."""

    def __init__(self, settings: LawSettings, target: int, poll: float, window: float) -> None:
        self.settings, self.target, self.poll, self.window = settings, target, poll, window
        self._last = -math.inf
        self._history: deque[tuple[float, int]] = deque()

    def decide(self, s: Signals, now: float) -> Decision:
        ordered = s.ready + s.starting
        if now - self._last < self.poll:
            return Decision(ordered, ordered, "none", "poll")
        self._last = now
        cfg = self.settings
        desired = min(max(math.ceil(s.queued / self.target), cfg.min_workers), cfg.max_workers)
        self._history.append((now, desired))
        while now - self._history[0][0] > self.window:
            self._history.popleft()
        if desired > ordered:
            return Decision(desired, desired, "up", "queue")
        stable = max(d for _, d in self._history)
        if stable < ordered:
            return Decision(stable, desired, "down", "queue")
        return Decision(ordered, desired, "none", "queue")


class OngoingRule:
    """Ray Serve's: ``ceil(ongoing / target)`` held for the up/down delay."""

    def __init__(
        self, settings: LawSettings, target: float, look_back: float, up: float, down: float
    ) -> None:
        self.settings, self.target, self.look_back = settings, target, look_back
        self.up_delay, self.down_delay = up, down
        self._samples: deque[tuple[float, int]] = deque()
        self._since: tuple[str, float] | None = None

    def decide(self, s: Signals, now: float) -> Decision:
        ordered = s.ready + s.starting
        self._samples.append((now, s.running + s.queued))
        while now - self._samples[0][0] > self.look_back:
            self._samples.popleft()
        ongoing = sum(n for _, n in self._samples) / len(self._samples)
        cfg = self.settings
        desired = min(max(math.ceil(ongoing / self.target), cfg.min_workers), cfg.max_workers)
        direction: Direction = (
            "up" if desired > ordered else "down" if desired < ordered else "none"
        )
        if direction == "none":
            self._since = None
            return Decision(ordered, desired, "none", "ongoing")
        if self._since is None or self._since[0] != direction:
            self._since = (direction, now)
        delay = self.up_delay if direction == "up" else self.down_delay
        if now - self._since[1] >= delay:
            self._since = None
            return Decision(desired, desired, direction, "ongoing")
        return Decision(ordered, desired, "none", "delay")


@dataclass
class Run:
    """What one (trace, policy) run observed."""

    actions: list[tuple[float, str, int, int]] = field(default_factory=list)
    samples: list[tuple[float, int, int]] = field(default_factory=list)  # t, ready, processes


class ListingDriver(LocalDriver):
    """The local driver, listing each scaling action in the run's ``actions``."""

    def __init__(self, supervisor: Supervisor, spawn: Callable[[], Any], run: Run, t0: float):
        super().__init__(supervisor, spawn)
        self.run, self.t0 = run, t0

    async def scale(self, model: str, target: int, live: tuple[WorkerInfo, ...]) -> None:
        before = len(self.active())
        await super().scale(model, target, live)
        direction = "up" if target > before else "down"
        self.run.actions.append((time.monotonic() - self.t0, direction, before, target))


def _policies(s: Sizes, trace: Trace) -> list[tuple[str, Callable[[LawSettings], Policy] | int]]:
    dynamic: list[tuple[str, Callable[[LawSettings], Policy] | int]] = [
        ("keda-queue", lambda cfg: QueueRule(cfg, s.concurrency, 5.0, s.down_window)),
        ("ray-ongoing", lambda cfg: OngoingRule(cfg, 2.0, 5.0, 5.0, s.down_window)),
        ("llmq", ControlLaw),
    ]
    if trace.dynamic_only:
        return dynamic
    return [
        ("static-peak", provision(trace.peak, s)),
        ("static-mean", provision(trace.mean, s)),
        *dynamic,
    ]


async def _drive(url: str, trace: Trace, s: Sizes, seed: int) -> list[dict[str, Any]]:
    """Every phase of the trace as its own open loop, started at its offset."""

    def phase(p: Phase, i: int) -> list[dict[str, Any]]:
        time.sleep(p.offset)
        config = s.load(
            seed * 10 + i,
            timeout=120.0,
            base_url=url,
            request_rate=math.inf if p.ramp else p.rate,
            burstiness=p.burstiness,
            ramp_up=p.ramp,
            duration=p.duration,
        )
        result = traffic.run(config)
        return [
            {
                "sent_s": r.sent_s + p.offset,
                "ok": r.ok,
                "failure": r.failure,
                "ttft_ms": None if r.ttft_s is None else r.ttft_s * 1000,
                "tpot_ms": None if r.tpot_s is None else r.tpot_s * 1000,
                "output_tokens": r.output_tokens,
                "phase": i,
            }
            for r in result.measurements
        ]

    parts = await asyncio.gather(
        *(asyncio.to_thread(phase, p, i) for i, p in enumerate(trace.phases))
    )
    return [r for part in parts for r in part]


async def _one(
    log: BinaryIO, redis: Redis, redis_url: str, url: str, trace: Trace, policy: str,
    rule: Callable[[LawSettings], Policy] | int, s: Sizes, seed: int,
) -> dict[str, Any]:  # fmt: skip
    supervisor = Supervisor(out=log)
    numbers = itertools.count(1)
    spawned: list[Child] = []
    env = clean_env(
        LLMQ_REDIS_URL=redis_url,
        LLMQ_CONCURRENCY=str(s.concurrency),
        LLMQ_MODEL_TOKENS_PER_SECOND=str(s.tokens_per_second),
        LLMQ_MODEL_LOAD_SECONDS=str(s.load_seconds),
        LLMQ_DRAIN_SECONDS="10",
    )

    async def spawn() -> Child:
        child = await supervisor.start(
            f"worker-{next(numbers)}", [sys.executable, "-m", "cli", "worker"], env
        )
        spawned.append(child)
        return child

    run = Run()
    t0 = time.monotonic()
    driver = ListingDriver(supervisor, spawn, run, t0)
    initial = rule if isinstance(rule, int) else provision(trace.start_rate, s)
    await driver.scale("mock", initial, ())
    while len(await registry.live_workers(redis, 5.0)) < initial:
        await asyncio.sleep(0.1)
    run.actions.clear()
    stop = asyncio.Event()
    controller_task = None
    if not isinstance(rule, int):
        settings = ControllerSettings(
            redis_url=redis_url,
            autoscale=f"1:{s.max_workers}",
            slo_ttft_ms=TTFT_SLO_MS,
            slo_tpot_ms=TPOT_SLO_MS,
            scale_down_window_seconds=s.down_window,
            worker_startup_seconds=s.load_seconds + 1,
        )
        controller = Controller(
            redis, settings, ["mock"], driver, bounds=(1, s.max_workers),
            concurrency=s.concurrency, make_policy=rule,
        )  # fmt: skip
        controller_task = asyncio.create_task(controller.run(stop))

    async def sample() -> None:
        while not stop.is_set():
            live = await registry.live_workers(redis, 5.0)
            processes = sum(1 for c in spawned if not c.ended.is_set())
            run.samples.append((time.monotonic() - t0, len(live), processes))
            await asyncio.sleep(0.25)

    sampler = asyncio.create_task(sample())
    t0 = time.monotonic()
    driver.t0 = t0
    try:
        records = await _drive(url, trace, s, seed)
    finally:
        stop.set()
        if controller_task is not None:
            await controller_task
        await sampler
        await driver.close()
        await supervisor.close()
        await redis.flushall()
    figures = _figures(trace, policy, s, records, run)
    figures["startup_s"] = driver.startup_seconds()
    return figures


def _figures(
    trace: Trace, policy: str, s: Sizes, records: list[dict[str, Any]], run: Run
) -> dict[str, Any]:
    ok = [r for r in records if r["ok"]]
    n = len(records)
    samples = [x for x in run.samples if x[0] <= trace.length]
    worker_s = sum((b[0] - a[0]) * a[2] for a, b in itertools.pairwise(samples))
    out: dict[str, Any] = {
        "requests": n,
        "failed": n - len(ok),
        "ttft_attainment": sum(1 for r in ok if r["ttft_ms"] <= TTFT_SLO_MS) / n if n else None,
        "tpot_attainment": sum(
            1 for r in ok if r["tpot_ms"] is None or r["tpot_ms"] <= TPOT_SLO_MS
        ) / n if n else None,
        "worker_seconds": worker_s,
        "max_workers": max((x[2] for x in samples), default=0),
        "scale_ins": sum(b - t for _, d, b, t in run.actions if d == "down"),
        "actions": run.actions,
    }  # fmt: skip
    if trace.steps_at:
        # from each step's first request (the load generator takes a moment to start)
        steps_at = [
            min((r["sent_s"] for r in records if r["phase"] == i + 1), default=nominal)
            for i, nominal in enumerate(trace.steps_at)
        ]
        out["steps_at"] = steps_at
        firsts: list[float | None] = []
        for at, until in zip(steps_at, (*steps_at[1:], math.inf), strict=True):
            ups = [t for t, d, _, _ in run.actions if d == "up" and at <= t < until]
            firsts.append(ups[0] - at if ups else None)
        out["first_actions_s"] = firsts
        out["first_action_s"] = None if None in firsts else max(f for f in firsts if f is not None)
        at = steps_at[0]
        need = math.ceil(trace.peak * s.service_s / s.concurrency)
        full = [t for t, ready, _ in samples if t >= at and ready >= need]
        out["full_capacity_s"] = full[0] - at if full else None
    if trace.name == "steady":
        skip = STEADY_SKIP_S
        dirs = [d for t, d, _, _ in run.actions if t >= skip]
        window = trace.length - skip
        out["reversal_window_s"] = window
        out["reversals"] = sum(1 for a, b in itertools.pairwise(dirs) if a != b)
        out["reversals_per_10min"] = out["reversals"] * 600 / window
    return out


def run(ctx: Context) -> ScenarioResult:
    _check_subset(ctx)
    return asyncio.run(_run(ctx))


def _fixed(names: tuple[str, ...]) -> list[tuple[str, Callable[[LawSettings], Policy] | int]]:
    """``static-N`` policies named on the command line: a fixed count of ``N`` workers
    (to measure what a count holds, e.g. the steady trace on 3)."""
    return [(n, int(n.removeprefix("static-"))) for n in names if re.fullmatch(r"static-\d+", n)]


def _check_subset(ctx: Context) -> None:
    """A misspelt trace or policy fails at once, not after the other runs."""
    every = traces(Sizes())
    known = {
        "traces": [t.name for t in every],
        "policies": [p for p, _ in _policies(Sizes(), every[0])],
    }
    for kind, chosen in (("traces", ctx.traces), ("policies", ctx.policies)):
        fixed = [n for n, _ in _fixed(chosen)] if kind == "policies" else []
        unknown = [n for n in chosen if n not in known[kind] and n not in fixed]
        if unknown:
            raise ValueError(f"unknown {kind} {unknown}; choose from {known[kind]}")


async def _run(ctx: Context) -> ScenarioResult:
    s = QUICK if ctx.quick else Sizes()
    redis_server = EmbeddedRedis()
    redis_server.start()
    port = free_port()
    log = (ctx.log_dir / "autoscale.log").open("ab")
    api_sup = Supervisor(out=log)
    await api_sup.start(
        "api",
        [sys.executable, "-m", "cli", "api"],
        clean_env(LLMQ_REDIS_URL=redis_server.url, LLMQ_PORT=str(port), LLMQ_ACCEPT_MODELS="mock"),
    )
    url = f"http://127.0.0.1:{port}"
    redis = Redis.from_url(redis_server.url, decode_responses=True)
    results: dict[str, dict[str, dict[str, Any]]] = {}
    try:
        await asyncio.sleep(2.0)
        for i, trace in enumerate(traces(s)):
            if ctx.traces and trace.name not in ctx.traces:
                continue
            results[trace.name] = {}
            static_runs: dict[int, str] = {}
            for policy, rule in [*_policies(s, trace), *_fixed(ctx.policies)]:
                if ctx.policies and policy not in ctx.policies:
                    continue
                if isinstance(rule, int) and rule in static_runs:  # the same fixed count
                    same = static_runs[rule]
                    results[trace.name][policy] = {**results[trace.name][same], "same_as": same}
                    continue
                ctx.say(f"  autoscale: {trace.name} / {policy}")
                results[trace.name][policy] = await _one(
                    log, redis, redis_server.url, url, trace, policy, rule, s, seed=i + 1
                )
                if isinstance(rule, int):
                    static_runs[rule] = policy
    finally:
        await redis.aclose()
        await api_sup.close()
        redis_server.stop()
        log.close()
    return _report(s, results)


def _report(s: Sizes, results: dict[str, dict[str, dict[str, Any]]]) -> ScenarioResult:
    every = traces(s)
    policies = [p for p, _ in _policies(s, every[0])]
    dynamic = [p for p in policies if not p.startswith("static")]
    shared = [t.name for t in every if not t.dynamic_only and t.name in results]
    rows = []
    for trace, by_policy in results.items():
        for policy, r in by_policy.items():
            rows.append([
                trace, policy, pct(r["ttft_attainment"], 1), pct(r["tpot_attainment"], 1),
                fmt(r["worker_seconds"], 0), str(r["max_workers"]),
                fmt(r.get("first_action_s")), fmt(r.get("full_capacity_s")),
                fmt(r.get("reversals_per_10min")), str(r["scale_ins"]), str(r["failed"]),
            ])  # fmt: skip
    shared = [t for t in shared if {"llmq", "static-peak"} <= results[t].keys()]
    full = len(shared) == sum(1 for t in every if not t.dynamic_only)
    ran = [p for p in policies if shared and all(p in results[t] for t in shared)]
    totals = {p: sum(results[t][p]["worker_seconds"] for t in shared) for p in ran}
    llmq = {t: results[t]["llmq"] for t in results if "llmq" in results[t]}
    savings = {
        t: 1 - llmq[t]["worker_seconds"] / results[t]["static-peak"]["worker_seconds"]
        for t in shared
    }
    saving = sum(savings.values()) / len(savings) if savings else None
    summed = 1 - totals["llmq"] / totals["static-peak"] if shared else None
    scale_ins = sum(r[p]["scale_ins"] for r in results.values() for p in dynamic if p in r)
    failed_dyn = sum(r[p]["failed"] for r in results.values() for p in dynamic if p in r)
    firsts = [f for t in llmq for f in llmq[t].get("first_actions_s", [])]
    first = None if not firsts or None in firsts else max(firsts)
    swings_note = (
        f" (swings {pct(llmq['swings']['ttft_attainment'], 1)})" if "swings" in llmq else ""
    )
    step, steady = llmq.get("step"), llmq.get("steady")
    subset = "" if full else " (a subset of the traces: not the target's figure)"
    targets = [
        Target(
            ">= 99% of requests within the TTFT SLO on the step trace (llmq)",
            None if step is None else step["ttft_attainment"] >= 0.99,
            "not run" if step is None else pct(step["ttft_attainment"], 1) + swings_note,
        ),
        Target(
            "worker-seconds >= 30% below static-at-peak (llmq; the mean of the four traces' "
            "savings, each trace weighing the same)",
            None if not full else saving is not None and saving >= 0.30,
            "not run" if not shared else f"{pct(saving)} less{subset} ("
            + ", ".join(f"{t} {pct(v)}" for t, v in savings.items())
            + f"); summed over the traces' lengths {fmt(totals['llmq'], 0)} vs "
            f"{fmt(totals['static-peak'], 0)}: {pct(summed)} less",
        ),
        Target(
            "first scale action <= 5 s after the step (llmq, the latest of every step and swing)",
            None if not firsts else first is not None and first <= 5,
            f"{fmt(first)} s (each: " + ", ".join(fmt(f) for f in firsts) + ")",
        ),
        Target(
            "0 errored or cut streams across >= 100 scale-in events (all dynamic policies)",
            False if failed_dyn else (True if scale_ins >= 100 else None),
            f"{failed_dyn} failed across {scale_ins} scale-ins",
        ),
        Target(
            "<= 1 reversal per 10 minutes at steady load (llmq)",
            None if steady is None else steady["reversals_per_10min"] <= 1,
            "not run" if steady is None else
            f"{steady['reversals']} in {fmt(steady['reversal_window_s'], 0)} s measured "
            f"({fmt(steady['reversals_per_10min'])} per 10 min)",
        ),
    ]  # fmt: skip
    md = "\n\n".join([
        f"Workers of {s.concurrency} slots, model {s.tokens_per_second:g} tok/s x "
        f"{s.output_tokens} tokens (S = {s.service_s:g} s), load time {s.load_seconds:g} s, "
        f"1..{s.max_workers} workers; SLOs TTFT {TTFT_SLO_MS:g} ms, TPOT {TPOT_SLO_MS:g} ms. "
        f"Traces: step {s.low:g} -> {s.high:g} req/s at {s.step_at:g} s for {s.step_len:g} s, "
        f"then {s.tail:g} s back at {s.low:g}; ramp {s.low:g} -> {s.high:g} req/s over "
        f"{s.ramp_len:g} s; bursty gamma (burstiness {s.burstiness:g}) at {s.bursty_rate:g} "
        f"req/s for {s.bursty_len:g} s; steady {s.steady_rate:g} req/s (70% of 4 workers) "
        f"for {s.steady_len:g} s, reversals counted after {STEADY_SKIP_S:g} s; swings "
        f"(dynamic policies only): the step for {s.swing_len:g} s, {s.swings} times, each "
        f"followed by {s.swing_gap:g} s at {s.low:g} req/s. Dynamic policies start "
        "each trace at the count provisioned for its first rate. Scale-down "
        f"windows {s.down_window:g} s; KEDA polling and Ray's upscale delay 5 s (their 30 s "
        "defaults / 6). Worker-seconds count worker processes from spawn to exit, loading "
        "and draining ones included. A static policy whose count equals one already run "
        "on a trace reuses that run. Measured worker start-up (llmq run, spawn to "
        f"registered): {fmt(next(iter(llmq.values()), {}).get('startup_s'))} s.",
        table(
            ["trace", "policy", "TTFT SLO", "TPOT SLO", "worker-s", "max workers",
             "first action (s)", "full capacity (s)", "reversals /10 min", "scale-ins", "failed"],
            rows,
        ),
        "Worker-seconds over the four traces every policy ran: " + ", ".join(
            f"{p} {fmt(totals[p], 0)}" for p in ran
        ) + ".",
        *(target_line(t.description, t.met, t.detail) for t in targets),
    ])  # fmt: skip
    data = {"settings": asdict(s), "results": results, "worker_seconds_total": totals}
    return ScenarioResult("autoscale", "Autoscaling policies", data, md, targets)
