"""Light load, llmq against the in-process baseline: what the distribution costs.

At light load nothing queues, so any difference in TTFT is the price of the
pipeline itself (HTTP, the Redis enqueue, the wake-up, the claim, the stream
relay) over the prototype's in-process server running the same mock model. Both
systems get the identical LoadConfig (same seed per repeat, so the same arrival
times and prompts) and the same number of slots. ``--policies fifo,prefix`` runs
llmq's side under each routing policy in turn on the same processes
(:mod:`bench.policy_turns`); one routing policy runs it under that one.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp

from bench import policy_turns, traffic
from bench.breakdown import pipeline_breakdown
from bench.procs import Stack
from bench.report import fmt, table, target_line
from bench.scenario import Context, ScenarioResult, Target, interleave
from bench.stats import median_of, paired_ratios
from loadgen import LoadConfig


@dataclass(frozen=True)
class Sizes(traffic.Requests):
    rate: float = 2.0
    requests: int = 60
    warmup: int = 3
    concurrency: int = 16


QUICK = Sizes(rate=5.0, requests=10, warmup=2, output_tokens=8)
KEYS = ("ttft_ms_median", "ttft_ms_p99", "e2el_ms_median", "e2el_ms_p99", "itl_ms_median")
LABELS = {
    "ttft_ms_median": "TTFT median (ms)",
    "ttft_ms_p99": "TTFT p99 (ms)",
    "e2el_ms_median": "E2E median (ms)",
    "e2el_ms_p99": "E2E p99 (ms)",
    "itl_ms_median": "ITL median (ms)",
}
TTFT_TARGET = 1.10


def _config(s: Sizes, seed: int, **target: Any) -> LoadConfig:
    return s.load(
        seed,
        timeout=60.0,
        request_rate=s.rate,
        num_requests=s.requests,
        warmup=s.warmup,
        baseline_concurrency=s.concurrency,
        **target,
    )


def _where(s: Sizes, ours: list[dict[str, Any]], med: dict[str, dict[str, Any]]) -> str:
    """One sentence splitting llmq's median TTFT into pipeline stages."""
    queue = median_of(ours, "accept_to_start_ms")
    first = median_of(ours, "start_to_first_token_ms")
    ttft, base = med["llmq"]["ttft_ms_median"], med["baseline"]["ttft_ms_median"]
    if queue is None or first is None or ttft is None or base is None:
        return "Pipeline breakdown unavailable (request records not found)."
    model = 1000 * (s.prompt_tokens * s.prefill_seconds_per_token + 1 / s.tokens_per_second)
    rest = ttft - queue - first
    return (
        f"Where llmq's median TTFT goes (medians from the request records and stream ids): "
        f"API accept -> worker start {queue:.1f} ms; worker start -> first token written "
        f"{first:.1f} ms (the model alone: {model:.0f} ms); the rest (HTTP in, relay, SSE "
        f"out, client) ~{rest:.1f} ms. Extra over the baseline: {ttft - base:.1f} ms."
    )


#: Idle time before each probe of the "after idle" series: a gap like the light
#: load's (Poisson 2 req/s leaves ~0.5 s between requests).
IDLE_GAP_S = 0.3
PROBES = 30


async def _healthz_ms(url: str, gap: float, probes: int) -> float:
    """Median ``GET /healthz`` round trip, ``gap`` seconds of idleness before each."""
    times: list[float] = []
    async with aiohttp.ClientSession(url) as session:
        async with session.get("/healthz") as response:  # connect first
            await response.read()
        for _ in range(probes):
            if gap:
                await asyncio.sleep(gap)
            began = time.perf_counter()
            async with session.get("/healthz") as response:
                await response.read()
            times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


def wake_cost(url: str, probes: int = PROBES) -> dict[str, float]:
    """What one HTTP hop costs here back to back, and after the system went idle.

    The light load leaves every process idle between requests, so each hop of the
    pipeline starts from idle; on a VM an idle process is slow to wake. This puts
    a number on it for the report, with the same HTTP client as the load.
    """
    return {
        "healthz_ms_back_to_back": asyncio.run(_healthz_ms(url, 0.0, probes)),
        "healthz_ms_after_idle": asyncio.run(_healthz_ms(url, IDLE_GAP_S, probes)),
    }


def run(ctx: Context) -> ScenarioResult:
    s = QUICK if ctx.quick else Sizes()
    worker_env = {
        "LLMQ_CONCURRENCY": str(s.concurrency),
        "LLMQ_MODEL_TOKENS_PER_SECOND": str(s.tokens_per_second),
        "LLMQ_MODEL_PREFILL_SECONDS_PER_TOKEN": str(s.prefill_seconds_per_token),
    }
    routing = policy_turns.routing_policies(ctx.policies)
    env = {"LLMQ_ROUTING": routing[0]} if len(routing) == 1 else {}
    with Stack(ctx.log_dir, api_env=env) as stack:
        stack.scale(1, {**worker_env, **env})

        def ours(i: int) -> dict[str, Any]:
            def once(seed: int) -> dict[str, Any]:
                result = traffic.run(_config(s, seed, base_url=stack.url))
                out = traffic.figures(result)
                out["breakdown"] = pipeline_breakdown(stack.redis.url, result.started_at)
                out.update(out["breakdown"])
                return out

            if len(routing) > 1:
                return policy_turns.in_turns(stack.redis.url, routing, i, once)
            return once(i)

        def baseline(i: int) -> dict[str, Any]:
            return traffic.figures(traffic.run(_config(s, i, in_process=True)))

        runs = interleave(ctx, ctx.repeats, [("llmq", ours), ("baseline", baseline)])
        wake = wake_cost(stack.url, 5 if ctx.quick else PROBES)
    med = {name: {k: median_of(rs, k) for k in KEYS} for name, rs in runs.items()}
    ratios = {k: paired_ratios(runs["llmq"], runs["baseline"], k) for k in KEYS}
    ttft_ratio = ratios["ttft_ms_median"]["median"]
    target = Target(
        f"llmq median TTFT within {TTFT_TARGET - 1:.0%} of the baseline's",
        None if ttft_ratio is None else ttft_ratio <= TTFT_TARGET,
        f"ratio {fmt(ttft_ratio, 2)}; llmq {fmt(med['llmq']['ttft_ms_median'])} ms, "
        f"baseline {fmt(med['baseline']['ttft_ms_median'])} ms",
    )
    rows = [
        [LABELS[k], fmt(med["llmq"][k]), fmt(med["baseline"][k]), fmt(ratios[k]["median"], 2)]
        for k in KEYS
    ]
    failed = {name: sum(r["failed"] or 0 for r in rs) for name, rs in runs.items()}
    turns = None
    if len(routing) > 1:
        turns = policy_turns.by_policy(runs["llmq"], routing, LABELS)
    md = "\n\n".join(
        [
            f"Poisson {s.rate:g} req/s, {s.requests} requests, prompt {s.prompt_tokens} / "
            f"output {s.output_tokens} tokens, model {s.tokens_per_second:g} tok/s + "
            f"{s.prefill_seconds_per_token:g} s/prompt token, {s.concurrency} slots each; "
            f"medians of {ctx.repeats} interleaved runs; ratio = median of per-pair ratios. "
            f"Failed requests: llmq {failed['llmq']}, baseline {failed['baseline']}.",
            table(["figure", "llmq", "baseline", "llmq / baseline"], rows),
            _where(s, runs["llmq"], med),
            f"One HTTP hop on this machine (`GET /healthz` with the load's client, aiohttp, "
            f"median): "
            f"{wake['healthz_ms_back_to_back']:.2f} ms back to back, "
            f"{wake['healthz_ms_after_idle']:.2f} ms after {IDLE_GAP_S:g} s idle; at light "
            "load every hop of the pipeline starts from idle.",
            target_line(target.description, target.met, target.detail),
            *([turns["md"]] if turns else []),
        ]
    )
    data = {
        "settings": asdict(s),
        "runs": runs,
        "medians": med,
        "ratios": ratios,
        "wake_cost": wake,
        "by_policy": turns["data"] if turns else None,
    }
    return ScenarioResult("light", "Light load: llmq vs in-process baseline", data, md, [target])
