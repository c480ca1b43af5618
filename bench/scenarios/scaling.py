"""Throughput against the number of workers: does adding workers add capacity?

Each worker runs at a fixed cap; a closed loop of twice the total cap keeps the
queue non-empty, so the workers' slots are the designed bottleneck. The model is
fast enough per request that the pipeline (API, Redis, relay, load generator)
has real work to do, and it is the limit only if it must be. Throughput is
counted in a steady window (after the first second, before the last send), and
efficiency is ``tput(N) / (N * tput(1))`` per repeat, the runs of 1, 2 and 4
workers taking turns. Whole-machine CPU utilisation over each run tells whether
the 2-core machine, rather than the design, stopped the scaling.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

from bench import traffic
from bench.procs import Stack
from bench.report import fmt, pct, table, target_line
from bench.scenario import Context, ScenarioResult, Target, interleave
from bench.stats import median, median_of
from bench.sysinfo import CpuMeter

EFFICIENCY_TARGET = 0.9
CPU_BOUND = 0.9  # machine utilisation from which the CPU counts as the limit


@dataclass(frozen=True)
class Sizes(traffic.Requests):
    workers: tuple[int, ...] = (1, 2, 4)
    cap: int = 8
    duration_s: float = 10.0
    steady_from_s: float = 1.0
    output_tokens: int = 16


QUICK = Sizes(workers=(1, 2), cap=4, duration_s=2.0, steady_from_s=0.5)


def _one(stack: Stack, s: Sizes, workers: int, seed: int, env: dict[str, str]) -> dict[str, Any]:
    stack.scale(workers, env)
    config = s.load(
        seed,
        timeout=60.0,
        base_url=stack.url,
        concurrency=2 * workers * s.cap,
        duration=s.duration_s,
    )
    meter = CpuMeter({**stack.pids(), "loadgen": os.getpid()}, stack.redis.url).start()
    result = traffic.run(config)
    cpu = meter.stop()
    out = traffic.figures(result)
    out.update(traffic.steady_throughput(result, s.steady_from_s, s.duration_s))
    out["cpu"] = cpu
    out["machine_utilisation"] = cpu["machine_utilisation"]
    out["cpus_ours"] = cpu["cpus_ours"]
    out["cpus_others"] = cpu["cpus_others"]
    out["ideal_requests_per_s"] = (
        workers
        * s.cap
        / (s.prompt_tokens * s.prefill_seconds_per_token + s.output_tokens / s.tokens_per_second)
    )
    return out


def run(ctx: Context) -> ScenarioResult:
    s = QUICK if ctx.quick else Sizes()
    env = {
        "LLMQ_CONCURRENCY": str(s.cap),
        "LLMQ_MODEL_TOKENS_PER_SECOND": str(s.tokens_per_second),
        "LLMQ_MODEL_PREFILL_SECONDS_PER_TOKEN": str(s.prefill_seconds_per_token),
    }
    with Stack(ctx.log_dir) as stack:
        systems = [(f"{n}w", lambda i, n=n: _one(stack, s, n, i, env)) for n in s.workers]
        runs = interleave(ctx, ctx.repeats, systems)
    one = runs[f"{s.workers[0]}w"]
    rows, targets, summary = [], [], {}
    for n in s.workers:
        rs = runs[f"{n}w"]
        eff_each = [
            r["requests_per_s"] / (n / s.workers[0] * base["requests_per_s"])
            if base["requests_per_s"]
            else None
            for r, base in zip(rs, one, strict=True)
        ]
        row = {
            "requests_per_s": median_of(rs, "requests_per_s"),
            "output_tokens_per_s": median_of(rs, "output_tokens_per_s"),
            "ideal_requests_per_s": rs[0]["ideal_requests_per_s"],
            "efficiency": median(eff_each),
            "efficiency_each": eff_each,
            "machine_utilisation": median_of(rs, "machine_utilisation"),
            "cpus_ours": median_of(rs, "cpus_ours"),
            "cpus_others": median_of(rs, "cpus_others"),
            "ttft_ms_median": median_of(rs, "ttft_ms_median"),
            "itl_ms_p99": median_of(rs, "itl_ms_p99"),
            "failed": sum(r["failed"] or 0 for r in rs),
            "cpu_s": {
                role: median(r["cpu"].get(role) for r in rs)
                for role in ("api", "workers", "redis", "loadgen")
            },
        }
        summary[n] = row
        cpu = row["cpu_s"]
        rows.append(
            [
                str(n),
                str(2 * n * s.cap),
                fmt(row["requests_per_s"]),
                fmt(row["ideal_requests_per_s"]),
                fmt(row["output_tokens_per_s"], 0),
                pct(row["efficiency"]),
                pct(row["machine_utilisation"]),
                f"{fmt(row['cpus_ours'], 2)} / {fmt(row['cpus_others'], 2)}",
                " / ".join(fmt(cpu[k], 1) for k in ("api", "workers", "redis", "loadgen")),
                fmt(row["ttft_ms_median"]),
                str(row["failed"]),
            ]
        )
        if n != s.workers[0]:
            targets.append(_target(n, row))
    md = "\n\n".join(
        [
            f"Closed loop of 2 x total cap users for {s.duration_s:g} s, cap {s.cap} per "
            f"worker, prompt {s.prompt_tokens} / output {s.output_tokens} tokens at "
            f"{s.tokens_per_second:g} tok/s; throughput counted from "
            f"{s.steady_from_s:g} s to {s.duration_s:g} s; efficiency = tput(N) / "
            f"(N x tput(1)), per repeat then median over {ctx.repeats}; CPU = whole machine "
            f"({os.cpu_count()} cores) over the run, split into the benchmarked processes "
            f"(stack + loadgen) and everything else; CPU seconds per run by process.",
            table(
                [
                    "workers",
                    "users",
                    "req/s",
                    "ideal req/s",
                    "output tok/s",
                    "efficiency",
                    "machine CPU",
                    "cores ours / others",
                    "CPU s api / workers / redis / loadgen",
                    "TTFT median (ms)",
                    "failed",
                ],
                rows,
            ),
            *(target_line(t.description, t.met, t.detail) for t in targets),
        ]
    )
    data = {"settings": asdict(s), "runs": runs, "summary": summary}
    return ScenarioResult("scaling", "Scaling: throughput vs workers", data, md, targets)


def _target(n: int, row: dict[str, Any]) -> Target:
    eff, cpu = row["efficiency"], row["machine_utilisation"]
    description = f"{n} workers at >= {EFFICIENCY_TARGET:.0%} of linear while CPU is not the limit"
    detail = f"efficiency {pct(eff)}, machine CPU {pct(cpu)}"
    if eff is None:
        return Target(description, None, detail)
    if eff >= EFFICIENCY_TARGET:
        return Target(description, True, detail)
    if cpu is not None and cpu >= CPU_BOUND:
        return Target(description, None, detail + ": CPU-bound, target does not apply")
    return Target(description, False, detail)
