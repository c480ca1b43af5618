"""How many concurrent streams llmq holds, as a share of what the floor holds on the same run.

The floor (:mod:`bench.floor`) is a bare in-process server: uvicorn, a raw ASGI
app, the mock model's timing in its own event loop, no Redis, no queue. What it
holds is what the machine can do with this client and this token timing; what
llmq holds below it is the price of the queue. Between the two, the floor
through one Redis hop (:mod:`bench.floor_via_redis`: the same server, every
token appended to a Redis stream and read back the cheapest way, the model in
the server or in a process of its own) bounds what any design relaying tokens
through Redis streams can hold here. All are driven by the same closed loop
(``llmq loadgen``'s client, N users, each request streaming long outputs at the
model's pace), level by level, in turns (floor, llmq, floor, llmq...) so that a
noisy neighbour hits all. llmq runs with two workers of N/2 slots each, so the
cap is never the limit; what gives out first is CPU. ``--systems`` and
``--levels`` choose a subset.

A level passes when every request succeeds and the ITL p99 (median over the
repeats) stays within 1.5 x the model's token interval; a system stops at its
first failing level. Each level also reports CPU seconds per delivered token
for each process (floor or API, the floor's model process or the workers, Redis,
and the load generator), which
says where the cost is, and output tokens per second, which shows whether
throughput keeps rising with load.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

from bench import traffic
from bench.procs import FloorServer, Stack
from bench.report import fmt, pct, table, target_line
from bench.scenario import Context, ScenarioResult, Target
from bench.stats import median, median_of
from bench.sysinfo import CpuMeter

ITL_FACTOR = 1.5
#: llmq must hold at least this share of the floor's streams.
TARGET_SHARE = 0.8


@dataclass(frozen=True)
class System:
    """One compared system: its name in the report and the processes whose CPU it shows."""

    name: str
    roles: tuple[str, ...]


_LLMQ_ROLES = ("api", "workers", "redis", "loadgen")
#: Every system a run can compare, by the id ``--systems`` selects it with.
SYSTEMS = {
    "floor": System("floor", ("floor", "loadgen")),
    "floor-redis": System("floor via Redis", ("floor", "redis", "loadgen")),
    "floor-redis-2p": System(
        "floor via Redis (model apart)", ("floor", "model", "redis", "loadgen")
    ),
    "llmq": System("llmq", _LLMQ_ROLES),
    "llmq-2api": System("llmq (2 API processes)", _LLMQ_ROLES),
}


@dataclass(frozen=True)
class Sizes(traffic.Requests):
    levels: tuple[int, ...] = (10, 25, 50, 75, 100, 150, 200, 250, 300, 400, 500, 600, 800)
    workers: int = 2
    systems: tuple[str, ...] = tuple(SYSTEMS)
    duration_s: float = 6.0
    output_tokens: int = 150


QUICK = Sizes(
    levels=(10, 20), systems=("floor", "floor-redis", "llmq"), duration_s=1.0, output_tokens=20
)

#: One run at a number of users: the figures of :func:`_once`.
Runner = Callable[[int, int], dict[str, Any]]


def _once(
    url: str, pids: dict[str, int], redis_url: str | None, s: Sizes, users: int, seed: int
) -> dict[str, Any]:
    """One closed-loop run at ``users`` streams: figures and CPU per token by process."""
    config = s.load(seed, timeout=120.0, base_url=url, concurrency=users, duration=s.duration_s)
    meter = CpuMeter({**pids, "loadgen": os.getpid()}, redis_url).start()
    result = traffic.run(config)
    cpu = meter.stop()
    out = traffic.figures(result)
    tokens = out["total_output_tokens"] or 0
    out["cpu"] = cpu
    out["machine_utilisation"] = cpu["machine_utilisation"]
    out["cpus_ours"] = cpu["cpus_ours"]
    out["cpus_others"] = cpu["cpus_others"]
    out["cpu_ms_per_token"] = {
        role: cpu[role] * 1000.0 / tokens if tokens else None
        for role in ("floor", "api", "model", "workers", "redis", "loadgen")
        if role in cpu
    }
    out["errors"] = traffic.first_errors(result)
    return out


def _floor_runner(floor: FloorServer, s: Sizes) -> Runner:
    def run(users: int, seed: int) -> dict[str, Any]:
        return _once(floor.url, floor.pids(), floor.redis_url, s, users, seed)

    return run


class WorkerPace(Protocol):
    """What a scenario's sizes say of its workers (capacity's and the cluster's)."""

    @property
    def workers(self) -> int: ...
    @property
    def tokens_per_second(self) -> float: ...
    @property
    def prefill_seconds_per_token(self) -> float: ...


def worker_env(s: WorkerPace, users: int) -> dict[str, str]:
    """The workers' settings for ``users`` streams: N/workers slots each, the model's pace."""
    return {
        "LLMQ_CONCURRENCY": str(-(-users // s.workers)),
        "LLMQ_MODEL_TOKENS_PER_SECOND": str(s.tokens_per_second),
        "LLMQ_MODEL_PREFILL_SECONDS_PER_TOKEN": str(s.prefill_seconds_per_token),
    }


def _llmq_runner(stack: Stack, s: Sizes) -> Runner:
    def run(users: int, seed: int) -> dict[str, Any]:
        stack.scale(s.workers, worker_env(s, users))
        return _once(stack.url, stack.pids(), stack.redis.url, s, users, seed)

    return run


def _summarise(runs: list[dict[str, Any]], users: int, s: Sizes) -> dict[str, Any]:
    """The repeats of one level: medians, failures summed; pass on median ITL p99."""
    keys = (
        "itl_ms_median",
        "itl_ms_p99",
        "ttft_ms_p99",
        "output_throughput",
        "lag_ms_p99",
        "machine_utilisation",
        "cpus_ours",
        "cpus_others",
    )
    out: dict[str, Any] = {k: median_of(runs, k) for k in keys}
    out["users"] = users
    out["failed"] = sum(r["failed"] or 0 for r in runs)
    failures: dict[str, int] = {}
    for r in runs:
        for kind, count in r["failures"].items():
            failures[kind] = failures.get(kind, 0) + count
    out["failures"] = failures
    roles = {role for r in runs for role in r["cpu_ms_per_token"]}
    out["cpu_ms_per_token"] = {
        role: median(r["cpu_ms_per_token"].get(role) for r in runs) for role in sorted(roles)
    }
    out["errors"] = [e for r in runs for e in r["errors"]][:3]
    limit = ITL_FACTOR * 1000.0 / s.tokens_per_second
    itl = out["itl_ms_p99"]
    out["itl_limit_ms"] = limit
    out["passed"] = bool(out["failed"] == 0 and itl is not None and itl <= limit)
    out["runs"] = runs
    return out


def _climb(ctx: Context, s: Sizes, systems: dict[str, Runner]) -> dict[str, list[dict[str, Any]]]:
    """Every level for every system still passing, the systems taking turns within a level."""
    levels: dict[str, list[dict[str, Any]]] = {name: [] for name in systems}
    for users in s.levels:
        alive = [n for n in systems if all(lv["passed"] for lv in levels[n])]
        if not alive:
            break
        runs: dict[str, list[dict[str, Any]]] = {n: [] for n in alive}
        for i in range(ctx.repeats):
            for name in alive:
                ctx.say(f"  {name}: {users} concurrent streams, run {i + 1}/{ctx.repeats}")
                runs[name].append(systems[name](users, 1000 * users + i))
        for name in alive:
            levels[name].append(_summarise(runs[name], users, s))
    return levels


def held(levels: list[dict[str, Any]]) -> int:
    passed = [lv["users"] for lv in levels if lv["passed"]]
    return max(passed) if passed else 0


def _system_table(system: System, levels: list[dict[str, Any]]) -> str:
    roles = system.roles
    rows = []
    for lv in levels:
        per = lv["cpu_ms_per_token"]
        rows.append(
            [
                str(lv["users"]),
                "pass" if lv["passed"] else "**fail**",
                fmt(lv["itl_ms_median"]),
                fmt(lv["itl_ms_p99"]),
                fmt(lv["ttft_ms_p99"]),
                f"{lv['failed']}" + (f" {lv['failures']}" if lv["failures"] else ""),
                fmt(lv["output_throughput"], 0),
                fmt(lv["lag_ms_p99"]),
                pct(lv["machine_utilisation"]),
                f"{fmt(lv['cpus_ours'], 2)} / {fmt(lv['cpus_others'], 2)}",
                " / ".join(fmt(per.get(r), 3) for r in roles),
                fmt(sum(v for v in per.values() if v is not None), 3),
            ]
        )
    return f"**{system.name}**\n\n" + table(
        [
            "streams",
            "result",
            "ITL median (ms)",
            "ITL p99 (ms)",
            "TTFT p99 (ms)",
            "failed",
            "output tok/s",
            "lag p99 (ms)",
            "machine CPU",
            "cores ours / others",
            "CPU ms/token " + " / ".join(roles),
            "CPU ms/token total",
        ],
        rows,
    )


def _chosen(ctx: Context, s: Sizes) -> list[str]:
    """The ids of the systems to compare, in :data:`SYSTEMS`'s order: ``--systems``
    if given, else the sizes' own."""
    ids = ctx.systems or s.systems
    unknown = [i for i in ids if i not in SYSTEMS]
    if unknown:
        raise ValueError(f"unknown systems {unknown}; choose from {', '.join(SYSTEMS)}")
    return [i for i in SYSTEMS if i in ids]


def _runner(processes: ExitStack, ctx: Context, s: Sizes, system_id: str) -> Runner:
    """Start one system's processes (stopped with ``processes``) and return its runner."""
    if system_id.startswith("floor"):
        floor = FloorServer(
            ctx.log_dir,
            s.tokens_per_second,
            s.prefill_seconds_per_token,
            via_redis=system_id != "floor",
            model_apart=system_id == "floor-redis-2p",
        )
        return _floor_runner(processes.enter_context(floor), s)
    apis = 2 if system_id == "llmq-2api" else 1
    stack = Stack(ctx.log_dir, api_env={"LLMQ_API_PROCESSES": str(apis)})
    return _llmq_runner(processes.enter_context(stack), s)


def _share(reached: int, of: int | None) -> float | None:
    return reached / of if of else None


def run(ctx: Context) -> ScenarioResult:
    s = QUICK if ctx.quick else Sizes()
    if ctx.levels:
        s = replace(s, levels=ctx.levels)
    chosen = _chosen(ctx, s)
    with ExitStack() as processes:
        systems = {SYSTEMS[i].name: _runner(processes, ctx, s, i) for i in chosen}
        levels = _climb(ctx, s, systems)
    floor_held = held(levels["floor"]) if "floor" in levels else None
    hop = SYSTEMS["floor-redis"].name
    hop_held = held(levels[hop]) if hop in levels else None
    summary_rows = []
    targets = []
    for name, lvs in levels.items():
        reached = held(lvs)
        share = _share(reached, floor_held)
        best = max((lv["output_throughput"] or 0.0 for lv in lvs), default=0.0)
        hop_share = "" if name.startswith("floor") else pct(_share(reached, hop_held))
        summary_rows.append([name, str(reached), pct(share), hop_share, fmt(best, 0)])
        if name.startswith("llmq") and floor_held is not None:
            targets.append(
                Target(
                    f"{name} holds >= {TARGET_SHARE:.0%} of the floor's streams",
                    share is not None and share >= TARGET_SHARE,
                    f"{reached} of {floor_held} ({pct(share)}); levels tried: "
                    + ", ".join(str(lv["users"]) for lv in lvs),
                )
            )
    notes = [
        f"{name} at {lv['users']} streams failed because: "
        + ("; ".join(lv["errors"]) or f"ITL p99 {fmt(lv['itl_ms_p99'])} ms > limit")
        for name, lvs in levels.items()
        for lv in lvs
        if not lv["passed"]
    ]
    md = "\n\n".join(
        [
            f"Closed loop of N users for {s.duration_s:g} s (each request {s.output_tokens} "
            f"tokens at {s.tokens_per_second:g} tok/s, prompt {s.prompt_tokens}); the floor "
            f"(bare in-process ASGI server), the floor via Redis (the same, every token "
            f"through a Redis stream; model apart: in a second process) and llmq "
            f"({s.workers} workers x N/{s.workers} slots) take turns at each level; pass = "
            f"no failures and ITL p99 <= {ITL_FACTOR:g} x {1000 / s.tokens_per_second:g} ms "
            f"(median over {ctx.repeats} runs per level); a system stops at its first "
            f"failing level. CPU ms per delivered token by process; lag = the load "
            f"generator's own send delay.",
            table(
                [
                    "system",
                    "streams held",
                    "share of the floor",
                    "share of the floor via Redis",
                    "best output tok/s",
                ],
                summary_rows,
            ),
            *(_system_table(SYSTEMS[i], levels[SYSTEMS[i].name]) for i in chosen),
            *notes,
            *(target_line(t.description, t.met, t.detail) for t in targets),
        ]
    )
    data = {
        "settings": asdict(s),
        "levels": levels,
        "held": {name: held(lvs) for name, lvs in levels.items()},
        "reached": held(levels["llmq"]) if "llmq" in levels else None,
    }
    return ScenarioResult(
        "capacity", "Capacity: streams held, llmq vs the floor", data, md, targets
    )
