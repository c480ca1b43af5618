"""How many concurrent streams the whole stack holds on this machine, loadgen included.

N users in a closed loop each stream long outputs at the model's pace, so about
N streams are always open. Two workers get N/2 slots each, so the cap is never
the limit: what gives out first is CPU (the load generator parsing SSE, the API
relaying, the workers publishing, Redis). A level passes when every request
succeeds and the ITL p99 stays within 1.5 x the model's token interval (a
stream that keeps its pace); the levels go up until the first failure. Each
level also reports CPU seconds per delivered token for each process role, which
says where the cost is and what to optimise first.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

from bench import traffic
from bench.procs import Stack
from bench.report import fmt, pct, table, target_line
from bench.scenario import Context, ScenarioResult, Target
from bench.stats import median, median_of
from bench.sysinfo import CpuMeter
from loadgen import LoadConfig

ITL_FACTOR = 1.5
ROLES = ("api", "workers", "redis", "loadgen")


@dataclass(frozen=True)
class Sizes:
    levels: tuple[int, ...] = (10, 25, 50, 100, 150, 200, 250, 500, 1000)
    workers: int = 2
    duration_s: float = 6.0
    prompt_tokens: int = 100
    output_tokens: int = 150
    tokens_per_second: float = 50.0
    prefill_seconds_per_token: float = 0.0001


QUICK = Sizes(levels=(10, 20), duration_s=1.0, output_tokens=20)


def _once(stack: Stack, s: Sizes, users: int, seed: int) -> dict[str, Any]:
    """One closed-loop run at ``users`` streams: figures and CPU per token by role."""
    config = LoadConfig(
        base_url=stack.url,
        concurrency=users,
        duration=s.duration_s,
        prompt_tokens=(s.prompt_tokens, s.prompt_tokens),
        output_tokens=(s.output_tokens, s.output_tokens),
        seed=seed,
        timeout=120.0,
    )
    meter = CpuMeter({**stack.pids(), "loadgen": os.getpid()}, stack.redis.url).start()
    result = traffic.run(config)
    cpu = meter.stop()
    out = traffic.figures(result)
    tokens = out["total_output_tokens"] or 0
    out["cpu"] = cpu
    out["machine_utilisation"] = cpu["machine_utilisation"]
    out["cpus_ours"] = cpu["cpus_ours"]
    out["cpus_others"] = cpu["cpus_others"]
    out["cpu_ms_per_token"] = {
        role: cpu[role] * 1000.0 / tokens if tokens else None for role in ROLES if role in cpu
    }
    out["errors"] = traffic.first_errors(result)
    return out


def _level(ctx: Context, stack: Stack, s: Sizes, users: int) -> dict[str, Any]:
    """``ctx.repeats`` runs at one level; it passes on the median ITL p99 and zero failures."""
    per_worker = -(-users // s.workers)
    stack.scale(
        s.workers,
        {
            "LLMQ_CONCURRENCY": str(per_worker),
            "LLMQ_MODEL_TOKENS_PER_SECOND": str(s.tokens_per_second),
            "LLMQ_MODEL_PREFILL_SECONDS_PER_TOKEN": str(s.prefill_seconds_per_token),
        },
    )
    runs = []
    for i in range(ctx.repeats):
        ctx.say(f"  {users} concurrent streams, run {i + 1}/{ctx.repeats}")
        runs.append(_once(stack, s, users, seed=1000 * users + i))
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
    out["worker_concurrency"] = per_worker
    out["failed"] = sum(r["failed"] or 0 for r in runs)
    failures: dict[str, int] = {}
    for r in runs:
        for kind, count in r["failures"].items():
            failures[kind] = failures.get(kind, 0) + count
    out["failures"] = failures
    out["cpu_ms_per_token"] = {
        role: median(r["cpu_ms_per_token"].get(role) for r in runs) for role in ROLES
    }
    out["errors"] = [e for r in runs for e in r["errors"]][:3]
    limit = ITL_FACTOR * 1000.0 / s.tokens_per_second
    itl = out["itl_ms_p99"]
    out["itl_limit_ms"] = limit
    out["passed"] = bool(out["failed"] == 0 and itl is not None and itl <= limit)
    out["runs"] = runs
    return out


def run(ctx: Context) -> ScenarioResult:
    s = QUICK if ctx.quick else Sizes()
    levels: list[dict[str, Any]] = []
    with Stack(ctx.log_dir) as stack:
        for users in s.levels:
            level = _level(ctx, stack, s, users)
            levels.append(level)
            if not level["passed"]:
                break
    passed = [lv["users"] for lv in levels if lv["passed"]]
    reached = max(passed) if passed else 0
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
                " / ".join(fmt(per.get(r), 3) for r in ROLES),
            ]
        )
    target = Target(
        f"{s.levels[-1]} concurrent streams",
        reached >= s.levels[-1],
        f"held {reached} (levels tried: {', '.join(str(lv['users']) for lv in levels)})",
    )
    notes = [
        f"{lv['users']} streams failed because: "
        + ("; ".join(lv["errors"]) or f"ITL p99 {fmt(lv['itl_ms_p99'])} ms > limit")
        for lv in levels
        if not lv["passed"]
    ]
    md = "\n\n".join(
        [
            f"Closed loop of N users for {s.duration_s:g} s (each request {s.output_tokens} "
            f"tokens at {s.tokens_per_second:g} tok/s, prompt {s.prompt_tokens}), "
            f"{s.workers} workers x N/{s.workers} slots; pass = no failures and ITL p99 <= "
            f"{ITL_FACTOR:g} x {1000 / s.tokens_per_second:g} ms (median over {ctx.repeats} "
            f"runs per level), stopping at the first failing level. CPU ms per delivered "
            f"token by process; lag = the load generator's own send delay.",
            table(
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
                    "CPU ms/token api / workers / redis / loadgen",
                ],
                rows,
            ),
            *notes,
            target_line(target.description, target.met, target.detail),
        ]
    )
    data = {"settings": asdict(s), "levels": levels, "reached": reached}
    return ScenarioResult("capacity", "Capacity: concurrent streams", data, md, [target])
