"""A burst beyond capacity: llmq's bounded queue against the baseline's busy-wait.

Both get the same burst (Poisson arrivals at several times what their slots can
serve). The prototype's admission has no bound: every request waits, polling every
10 ms, so waiting times grow with the burst and nobody is told to back off. llmq
keeps at most ``LLMQ_MAX_QUEUE_DEPTH`` waiting and answers the rest at once with
429 + ``Retry-After``, so the accepted requests keep a bounded TTFT. Reported
for each: completions, the share rejected, the TTFT of accepted requests; for
llmq also how fast the 429s came back and whether ``/healthz`` stayed responsive
(polled from a separate process during the burst).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from bench import traffic
from bench.procs import BenchProcess, Stack, clean_env
from bench.report import fmt, pct, table, target_line
from bench.scenario import Context, ScenarioResult, Target, interleave
from bench.stats import describe_ms, median_of
from loadgen import LoadConfig, RunResult


@dataclass(frozen=True)
class Sizes(traffic.Requests):
    requests: int = 200
    rate: float = 20.0
    slots: int = 5
    max_queue_depth: int = 10
    output_tokens: int = 50


QUICK = Sizes(requests=30, rate=30.0, output_tokens=10)


def _config(s: Sizes, seed: int, **target: Any) -> LoadConfig:
    return s.load(
        seed,
        timeout=300.0,
        request_rate=s.rate,
        num_requests=s.requests,
        baseline_concurrency=s.slots,
        **target,
    )


def _figures(result: RunResult) -> dict[str, Any]:
    out = traffic.figures(result)
    requests = out["requests"] or 0
    rejected = traffic.rejected(result)
    out["rejected"] = len(rejected)
    out["rejected_share"] = len(rejected) / requests if requests else None
    out["other_failures"] = (out["failed"] or 0) - len(rejected)
    reject_stats = describe_ms(rejected)
    out["reject_ms_median"] = reject_stats["median"]
    out["reject_ms_p99"] = reject_stats["p99"]
    return out


def _probe_result(probe: BenchProcess) -> dict[str, Any]:
    probe.popen.wait(60)
    probe.wait_stopped()
    lines = [line for line in probe.tail(4000).splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {"error": probe.tail(500)}


def run(ctx: Context) -> ScenarioResult:
    s = QUICK if ctx.quick else Sizes()
    worker_env = {
        "LLMQ_CONCURRENCY": str(s.slots),
        "LLMQ_MODEL_TOKENS_PER_SECOND": str(s.tokens_per_second),
        "LLMQ_MODEL_PREFILL_SECONDS_PER_TOKEN": str(s.prefill_seconds_per_token),
    }
    burst_s = s.requests / s.rate
    with Stack(ctx.log_dir, {"LLMQ_MAX_QUEUE_DEPTH": str(s.max_queue_depth)}) as stack:
        stack.scale(1, worker_env)

        def ours(i: int) -> dict[str, Any]:
            probe = BenchProcess(
                f"health-probe-{i}",
                ["bench.health_probe", stack.url + "/healthz", f"{burst_s + 2:.1f}"],
                clean_env(),
                ctx.log_dir,
            )
            try:
                out = _figures(traffic.run(_config(s, i, base_url=stack.url)))
            finally:
                health = _probe_result(probe)
            out["healthz"] = health
            out["healthz_ms_max"] = health.get("latency_ms_max")
            out["healthz_ms_p99"] = health.get("latency_ms_p99")
            out["healthz_failures"] = health.get("failures")
            return out

        def baseline(i: int) -> dict[str, Any]:
            return _figures(traffic.run(_config(s, i, in_process=True)))

        runs = interleave(ctx, ctx.repeats, [("llmq", ours), ("baseline", baseline)])
    keys = (
        "completed",
        "rejected_share",
        "other_failures",
        "ttft_ms_median",
        "ttft_ms_p99",
        "e2el_ms_p99",
        "reject_ms_median",
        "reject_ms_p99",
        "healthz_ms_p99",
        "healthz_ms_max",
        "healthz_failures",
        "duration_s",
    )
    med = {name: {k: median_of(rs, k) for k in keys} for name, rs in runs.items()}
    o, b = med["llmq"], med["baseline"]
    rows = [
        ["completed", fmt(o["completed"], 0), fmt(b["completed"], 0)],
        ["rejected (429) share", pct(o["rejected_share"]), pct(b["rejected_share"])],
        ["other failures", fmt(o["other_failures"], 0), fmt(b["other_failures"], 0)],
        ["TTFT median, accepted (ms)", fmt(o["ttft_ms_median"]), fmt(b["ttft_ms_median"])],
        ["TTFT p99, accepted (ms)", fmt(o["ttft_ms_p99"]), fmt(b["ttft_ms_p99"])],
        ["E2E p99, accepted (ms)", fmt(o["e2el_ms_p99"]), fmt(b["e2el_ms_p99"])],
        [
            "429 answer median / p99 (ms)",
            f"{fmt(o['reject_ms_median'])} / {fmt(o['reject_ms_p99'])}",
            "— (never rejects)",
        ],
        [
            "/healthz p99 / max during burst (ms)",
            f"{fmt(o['healthz_ms_p99'])} / {fmt(o['healthz_ms_max'])}",
            "— (no HTTP)",
        ],
        ["/healthz failures", fmt(o["healthz_failures"], 0), "—"],
        ["run duration (s)", fmt(o["duration_s"]), fmt(b["duration_s"])],
    ]
    md = "\n\n".join(
        [
            f"Burst of {s.requests} requests, Poisson {s.rate:g} req/s, on {s.slots} slots "
            f"(llmq: 1 worker, concurrency {s.slots}, LLMQ_MAX_QUEUE_DEPTH "
            f"{s.max_queue_depth}; baseline: {s.slots} slots, unbounded busy-wait); prompt "
            f"{s.prompt_tokens}, output {s.output_tokens} tokens at "
            f"{s.tokens_per_second:g} tok/s; medians of {ctx.repeats} interleaved runs.",
            table(["figure", "llmq", "baseline"], rows),
        ]
    )
    failures = o["healthz_failures"]
    target = Target(
        "/healthz answers throughout the burst",
        None if failures is None else failures == 0,
        f"{fmt(failures, 0)} failed probes, max {fmt(o['healthz_ms_max'])} ms",
    )
    md += "\n\n" + target_line(target.description, target.met, target.detail)
    data = {"settings": asdict(s), "runs": runs, "medians": med}
    return ScenarioResult("overload", "Overload: bounded queue vs busy-wait", data, md, [target])
