"""Routing: FIFO, least-loaded, first-block hashing and llmq's cache-aware policy.

Same stack and traffic for each policy (``LLMQ_ROUTING`` of the API and of four
worker processes); the workers run the mock's engine with a KV prefix cache of
``kv_blocks`` blocks, which holds only a part of each workload's working set, and a
prefill that costs ``prefill_s_per_token`` per uncached prompt token. Each workload
(:mod:`bench.routing_workloads`) runs on freshly started workers (cold caches).

Per policy and workload: the cluster's cache hit rate (prompt tokens the engines
found cached, from the request records, over all prompt tokens) beside the ideal's
(an unbounded cache shared by all, :func:`~bench.routing_workloads.ideal_hit_rate`),
TTFT mean/median/p99 (client side, streaming), output throughput, the busiest
worker's share of the requests, and how often the guards fired (the queue's routing
counters). The arrival rate is a fraction of FIFO's capacity on the shared-prompt
workload, measured first (a closed loop of 4 workers x slots users). The highest
sustainable rate: the shared and chat workloads again at higher rates, the highest
whose TTFT p90 meets the SLO. The load guard: ``prefix`` runs the ``hot`` and
``tenants`` workloads under the adaptive guard (the default) and each fixed setting
of :attr:`Sizes.fixed_guards`, in turn, ``repeats`` times (medians). In the
benchmark's environment,
``BENCH_ROUTING_IMBALANCE`` replaces the load guard's setting of every run
(:attr:`Sizes.imbalance`) and ``BENCH_ROUTING_WORKLOADS`` (comma-separated names)
runs only those workloads.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import aiohttp
from redis.asyncio import Redis

from bench import routing_workloads as wl
from bench.procs import BenchError, Stack
from bench.report import fmt, pct, table, target_line
from bench.scenario import Context, ScenarioResult, Target, interleave
from bench.stats import median, medians, ratio
from llmq.protocol.queue import Queue
from loadgen.figures import percentile
from loadgen.sse import DONE, frames

POLICIES = ("fifo", "least-loaded", "hash", "prefix")


@dataclass(frozen=True)
class Sizes:
    workers: int = 4
    concurrency: int = 8
    kv_blocks: int = 1200
    prefill_s_per_token: float = 0.0003
    tokens_per_second: float = 50.0
    #: Arrivals as a share of FIFO's closed-loop capacity on the shared workload (at
    #: 0.7 FIFO's queue grew through the run on the loaded machine of the first runs).
    load: float = 0.5
    #: LLMQ_ROUTING_IMBALANCE (None: unset, the adaptive guard).
    imbalance: int | None = None
    #: Fixed load guards `prefix` runs the tenants workload under, beside the adaptive
    #: one: AIBrix's 8, and 2 for workers of 8 slots.
    fixed_guards: tuple[int, ...] = (8, 2)
    #: The tenants workload's arrivals, a multiple of the base rate: its hot tenant
    #: then sends more than one worker serves.
    tenants_load: float = 1.5
    #: The tenants workload's KV cache per worker: two of its four documents.
    tenants_kv_blocks: int = 600
    #: Long enough for a steady state: each prompt's first misses (one per worker that
    #: comes to hold it) are a small part of the trace, as in a long-running service.
    requests: int = 600
    calibration_s: float = 25.0
    sessions: int = 64
    #: Chat sessions started per second.
    session_rate: float = 2.0
    #: Each session's own preamble (a system prompt and a document): with a short one
    #: a miss costs little more than a full hit's floor (a step and the new turn's
    #: tokens), so no policy could differ much.
    chat_system_tokens: int = 1000
    distinct_tokens: int = 500
    #: Higher rates (multiples of the base) tried for the sustainable rate.
    levels: tuple[float, ...] = (0.5, 1.5, 2.25)
    level_s: float = 25.0
    slo_ttft_p90_ms: float = 2000.0


QUICK = Sizes(requests=60, calibration_s=12, sessions=16, levels=(0.5, 2.0), level_s=12)


@dataclass
class Sent:
    prompt: str
    start: float
    rid: str = ""
    ttft_ms: float | None = None
    end: float | None = None
    text: str = ""
    output_tokens: int = 0
    error: str = ""


async def _send(
    http: aiohttp.ClientSession, url: str, prompt: str, conv: wl.Conversation, t0: float
) -> Sent:
    body: dict[str, Any] = {
        "model": "mock",
        "prompt": prompt,
        "max_tokens": conv.max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if conv.session:
        body["user"] = conv.session
    sent = Sent(prompt, time.perf_counter() - t0)
    try:
        async with http.post(url + "/v1/completions", json=body) as r:
            if r.status != 200:
                sent.error = f"{r.status}: {(await r.text())[:200]}"
                return sent
            async for frame in frames(r.content.iter_any()):
                if frame.data == DONE:
                    break
                chunk = frame.json()
                sent.rid = sent.rid or chunk["id"].split("-", 1)[1]
                for choice in chunk.get("choices", []):
                    if choice.get("text"):
                        if sent.ttft_ms is None:
                            sent.ttft_ms = (time.perf_counter() - t0 - sent.start) * 1000
                        sent.text += choice["text"]
                if chunk.get("usage"):
                    sent.output_tokens = chunk["usage"]["completion_tokens"]
    except (aiohttp.ClientError, TimeoutError) as exc:
        sent.error = repr(exc)
    sent.end = time.perf_counter() - t0
    return sent


async def _converse(
    http: aiohttp.ClientSession, url: str, conv: wl.Conversation, t0: float, out: list[Sent]
) -> None:
    await asyncio.sleep(max(0.0, conv.start_s - (time.perf_counter() - t0)))
    history = conv.system
    for i, question in enumerate(conv.questions):
        if i:
            await asyncio.sleep(conv.think_s)
        prompt = f"{history} {question}".strip()
        sent = await _send(http, url, prompt, conv, t0)
        out.append(sent)
        if sent.error:
            return
        history = prompt + sent.text


async def _drive(url: str, workload: wl.Workload) -> tuple[list[Sent], float]:
    out: list[Sent] = []
    timeout = aiohttp.ClientTimeout(total=600)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
        t0 = time.perf_counter()
        await asyncio.gather(*(_converse(http, url, c, t0, out) for c in workload.conversations))
        return out, time.perf_counter() - t0


async def _closed_loop(url: str, workload: wl.Workload, users: int, seconds: float) -> float:
    """Completions per second of ``users`` back-to-back clients (after a warm-up third)."""
    pending = list(workload.conversations)
    done: list[float] = []
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        t0 = time.perf_counter()

        async def user() -> None:
            while pending and time.perf_counter() - t0 < seconds:
                conv = pending.pop()
                sent = await _send(http, url, f"{conv.system} {conv.questions[0]}", conv, t0)
                if not sent.error and sent.end is not None:
                    done.append(sent.end)

        await asyncio.gather(*(user() for _ in range(users)))
    start = seconds / 3
    counted = [t for t in done if start <= t < seconds]
    return len(counted) / (seconds - start)


async def _records(url: str, rids: list[str]) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as http:

        async def one(rid: str) -> dict[str, Any]:
            async with http.get(f"{url}/v1/requests/{rid}") as r:
                found: dict[str, Any] = await r.json() if r.status == 200 else {}
                return found

        out: list[dict[str, Any]] = []
        for i in range(0, len(rids), 50):
            out += await asyncio.gather(*(one(r) for r in rids[i : i + 50]))
        return out


async def _read_stats(redis_url: str) -> dict[str, int]:
    client = Redis.from_url(redis_url, decode_responses=True)
    try:
        return await Queue(client, stream_maxlen=16, ttl_seconds=60).routing_stats("mock")
    finally:
        await client.aclose()


def _stats(redis_url: str) -> dict[str, int]:
    """The queue's routing counters (how often affinity chose and each guard fired)."""
    return asyncio.run(_read_stats(redis_url))


def _figures(stack: Stack, workload: wl.Workload) -> dict[str, Any]:
    """Run ``workload`` on the stack's (fresh) workers; its figures."""
    before = _stats(stack.redis.url)
    sent, wall = asyncio.run(_drive(stack.url, workload))
    after = _stats(stack.redis.url)
    ok = [s for s in sent if not s.error and s.ttft_ms is not None]
    records = asyncio.run(_records(stack.url, [s.rid for s in ok]))
    prompt_tokens = sum(int(r.get("prompt_tokens") or 0) for r in records)
    cached = sum(int(r.get("cached_tokens") or 0) for r in records)
    per_worker = Counter(r.get("worker") for r in records if r.get("worker"))
    ttfts = [s.ttft_ms for s in ok if s.ttft_ms is not None]
    busiest = max(per_worker.values()) if per_worker else 0
    mean_load = len(records) / max(len(per_worker), 1)
    span = max((s.end or 0.0) for s in ok) - min(s.start for s in sent) if ok else 0.0
    return {
        "requests": len(sent),
        "failed": len(sent) - len(ok),
        "errors": sorted({s.error for s in sent if s.error})[:3],
        "wall_s": wall,
        "hit_rate": cached / prompt_tokens if prompt_tokens else None,
        "ideal_hit_rate": wl.ideal_hit_rate(s.prompt for s in sorted(sent, key=lambda s: s.start)),
        "ttft_ms_mean": sum(ttfts) / len(ttfts) if ttfts else None,
        "ttft_ms_median": median(ttfts),
        "ttft_ms_p90": percentile(ttfts, 90) if ttfts else None,
        "ttft_ms_p99": percentile(ttfts, 99) if ttfts else None,
        "output_throughput": sum(s.output_tokens for s in ok) / span if span > 0 else None,
        "busiest_share": busiest / len(records) if records else None,
        "busiest_over_mean": busiest / mean_load if mean_load else None,
        "per_worker": dict(per_worker),
        "guards": {k: after[k] - before[k] for k in after},
    }


def _env(s: Sizes, policy: str) -> dict[str, str]:
    """Every part's settings; ``LLMQ_ROUTING`` seeds the fresh pool's policy, ``fifo``
    included: a pool of mocks would derive ``prefix`` (docs/policy.md)."""
    return {
        "LLMQ_ROUTING": policy,
        "LLMQ_CONCURRENCY": str(s.concurrency),
        "LLMQ_MODEL_KV_BLOCKS": str(s.kv_blocks),
        "LLMQ_MODEL_PREFILL_SECONDS_PER_TOKEN": str(s.prefill_s_per_token),
        "LLMQ_MODEL_TOKENS_PER_SECOND": str(s.tokens_per_second),
        "LLMQ_MAX_QUEUE_DEPTH": "100000",
        **({} if s.imbalance is None else {"LLMQ_ROUTING_IMBALANCE": str(s.imbalance)}),
    }


@dataclass
class Plan:
    """The workloads at the base rate, and the levels for the sustainable rate."""

    base: dict[str, wl.Workload] = field(default_factory=dict)
    levels: dict[str, dict[float, wl.Workload]] = field(default_factory=dict)


def _plan(s: Sizes, rate: float) -> Plan:
    n = s.requests
    plan = Plan()
    plan.base = {
        "shared": wl.shared(rate, n),
        "chat": wl.chat(s.session_rate, s.sessions, system_tokens=s.chat_system_tokens),
        "distinct": wl.distinct(rate, n, prompt_tokens=s.distinct_tokens),
        "hot": wl.hot(rate, n),
        "tenants": wl.tenants(rate * s.tenants_load, n),
    }
    plan.levels = {
        "shared": {
            m: wl.shared(rate * m, max(int(rate * m * s.level_s), 10), seed=10 + i)
            for i, m in enumerate(s.levels)
        },
        "chat": {
            m: wl.chat(
                s.session_rate * m, s.sessions, system_tokens=s.chat_system_tokens, seed=20 + i
            )
            for i, m in enumerate(s.levels)
        },
    }
    return plan


def _fresh(stack: Stack, s: Sizes, policy: str) -> None:
    stack.scale(0)
    stack.scale(s.workers, _env(s, policy))


def _calibrate(ctx: Context, s: Sizes) -> float:
    """FIFO's capacity on the shared workload (completions/s, closed loop)."""
    with Stack(ctx.log_dir, api_env=_env(s, "fifo")) as stack:
        _fresh(stack, s, "fifo")
        users = s.workers * s.concurrency
        work = wl.shared(1.0, 10_000, seed=99)
        return asyncio.run(_closed_loop(stack.url, work, users, s.calibration_s))


def _sized_for(s: Sizes, workload: str) -> Sizes:
    """The sizes a workload runs at (the tenants workload's own KV cache)."""
    return replace(s, kv_blocks=s.tenants_kv_blocks) if workload == "tenants" else s


#: The workloads the load guards are compared on.
GUARD_WORKLOADS = ("hot", "tenants")
#: The figures compared, as medians over the repeats.
GUARD_FIGURES = ("hit_rate", "ttft_ms_mean", "ttft_ms_p99", "busiest_over_mean")


def _compare_guards(ctx: Context, s: Sizes, plan: Plan) -> dict[str, dict[str, Any]]:
    """``prefix`` under each load guard on GUARD_WORKLOADS, the guards in turn per
    repeat; per guard and workload the runs and their medians."""
    names = [n for n in GUARD_WORKLOADS if n in plan.base]
    guards = {"adaptive": s.imbalance, **{f"fixed {k}": k for k in s.fixed_guards}}

    def runner(imbalance: int | None) -> Callable[[int], dict[str, Any]]:
        def run(_: int) -> dict[str, Any]:
            sized = replace(s, imbalance=imbalance)
            out = {}
            with Stack(ctx.log_dir, api_env=_env(sized, "prefix")) as stack:
                for name in names:
                    _fresh(stack, _sized_for(sized, name), "prefix")
                    out[name] = _figures(stack, plan.base[name])
            return out

        return run

    runs = interleave(ctx, ctx.repeats, [(g, runner(i)) for g, i in guards.items()])
    return {
        guard: {
            name: {
                "runs": [r[name] for r in repeats],
                **medians([r[name] for r in repeats], GUARD_FIGURES),
            }
            for name in names
        }
        for guard, repeats in runs.items()
    }


def _run_policy(ctx: Context, s: Sizes, policy: str, plan: Plan) -> dict[str, Any]:
    out: dict[str, Any] = {"workloads": {}, "levels": {}}
    with Stack(ctx.log_dir, api_env=_env(s, policy)) as stack:
        for name, workload in plan.base.items():
            ctx.say(f"  {policy}: {name} ({workload.requests} requests)")
            _fresh(stack, _sized_for(s, name), policy)
            out["workloads"][name] = _figures(stack, workload)
        for name, levels in plan.levels.items():
            for m, workload in levels.items():
                ctx.say(f"  {policy}: {name} at x{m:g}")
                _fresh(stack, s, policy)
                out["levels"].setdefault(name, {})[str(m)] = _figures(stack, workload)
    return out


def _sustainable(s: Sizes, result: dict[str, Any], name: str) -> float:
    """The highest multiple of the base rate whose TTFT p90 met the SLO (0: none)."""
    tried = {
        1.0: result["workloads"][name],
        **{float(m): f for m, f in result["levels"][name].items()},
    }
    best = 0.0
    for m in sorted(tried):
        p90 = tried[m].get("ttft_ms_p90")
        if tried[m]["failed"] == 0 and p90 is not None and p90 <= s.slo_ttft_p90_ms:
            best = m
    return best


def _targets(s: Sizes, runs: dict[str, dict[str, Any]]) -> list[Target]:
    def w(policy: str, name: str) -> dict[str, Any]:
        figures: dict[str, Any] = runs[policy]["workloads"][name]
        return figures

    ran = set(runs["prefix"]["workloads"])
    targets = []
    for name in ("shared", "chat"):
        if name not in ran:
            continue
        ours = w("prefix", name)
        share = ratio(ours["hit_rate"], ours["ideal_hit_rate"])
        targets.append(
            Target(
                f"{name}: hit rate >= 90% of the ideal's",
                None if share is None else share >= 0.9,
                f"{pct(ours['hit_rate'])} of {pct(ours['ideal_hit_rate'])}",
            )
        )
        faster = ratio(w("fifo", name)["ttft_ms_mean"], ours["ttft_ms_mean"])
        targets.append(
            Target(
                f"{name}: mean TTFT >= 3x lower than FIFO",
                None if faster is None else faster >= 3,
                f"{fmt(faster, 2)}x",
            )
        )
        rates = (_sustainable(s, runs["prefix"], name), _sustainable(s, runs["fifo"], name))
        targets.append(
            Target(
                f"{name}: sustainable rate at the SLO >= 1.5x FIFO's",
                rates[1] > 0 and rates[0] >= 1.5 * rates[1] if rates[1] else None,
                f"x{rates[0]:g} vs x{rates[1]:g} of the base rate",
            )
        )
    if "distinct" in ran:
        targets += _distinct_targets(w("prefix", "distinct"), w("fifo", "distinct"))
    if "hot" in ran and "least-loaded" in runs:
        targets += _hot_targets(w("prefix", "hot"), w("least-loaded", "hot"))
    if "tenants" in ran:
        ours = w("prefix", "tenants")
        share = ratio(ours["hit_rate"], ours["ideal_hit_rate"])
        targets.append(
            Target(
                "tenants: hit rate >= 90% of the ideal's",
                None if share is None else share >= 0.9,
                f"{pct(ours['hit_rate'])} of {pct(ours['ideal_hit_rate'])}",
            )
        )
    return targets


def _distinct_targets(ours: dict[str, Any], fifo: dict[str, Any]) -> list[Target]:
    p99 = ratio(ours["ttft_ms_p99"], fifo["ttft_ms_p99"])
    tput = ratio(ours["output_throughput"], fifo["output_throughput"])
    return [
        Target(
            "distinct: TTFT p99 and throughput within 5% of FIFO",
            None if p99 is None or tput is None else p99 <= 1.05 and tput >= 0.95,
            f"p99 x{fmt(p99, 2)}, throughput x{fmt(tput, 2)}",
        )
    ]


def _hot_targets(ours: dict[str, Any], least: dict[str, Any]) -> list[Target]:
    targets = []
    targets.append(
        Target(
            "hot: busiest worker <= 1.25x the mean load",
            None if ours["busiest_over_mean"] is None else ours["busiest_over_mean"] <= 1.25,
            f"{fmt(ours['busiest_over_mean'], 2)}x",
        )
    )
    p99 = ratio(ours["ttft_ms_p99"], least["ttft_ms_p99"])
    targets.append(
        Target(
            "hot: TTFT p99 no worse than least-loaded",
            None if p99 is None else p99 <= 1.0,
            f"x{fmt(p99, 2)}",
        )
    )
    return targets


def _guard_targets(guards: dict[str, dict[str, Any]]) -> list[Target]:
    """The adaptive load guard against the fixed ones: on each workload, a median mean
    TTFT within 10 % of the best fixed guard's (no number to guess)."""
    targets = []
    for name in GUARD_WORKLOADS:
        fixed = {g: f[name]["ttft_ms_mean"] for g, f in guards.items() if g != "adaptive"}
        if name not in guards.get("adaptive", {}) or not fixed:
            continue
        best = min((v for v in fixed.values() if v is not None), default=None)
        against = ratio(guards["adaptive"][name]["ttft_ms_mean"], best)
        targets.append(
            Target(
                f"{name}: adaptive guard's mean TTFT within 10% of the best fixed guard's",
                None if against is None else against <= 1.1,
                f"x{fmt(against, 2)} of {fmt(best)} ms",
            )
        )
    return targets


ROWS: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("hit_rate", "cache hit rate", pct),
    ("ideal_hit_rate", "ideal's hit rate", pct),
    ("ttft_ms_mean", "TTFT mean (ms)", fmt),
    ("ttft_ms_median", "TTFT median (ms)", fmt),
    ("ttft_ms_p99", "TTFT p99 (ms)", fmt),
    ("output_throughput", "output tokens/s", fmt),
    ("busiest_share", "busiest worker's share", pct),
    ("busiest_over_mean", "busiest / mean load", lambda v: fmt(v, 2)),
    ("failed", "failed", fmt),
)


def _markdown(s: Sizes, rate: float, runs: dict[str, Any], targets: list[Target]) -> str:
    parts = [
        f"{s.workers} workers x {s.concurrency} slots, mock engine: KV cache {s.kv_blocks} "
        f"blocks of 16 tokens, prefill {s.prefill_s_per_token * 1000:g} ms per uncached prompt "
        f"token, {s.tokens_per_second:g} steps/s. FIFO's capacity on the shared workload: "
        f"{rate / s.load:.2f} requests/s; base rate {s.load:.0%} of it ({rate:.2f}/s); chat: "
        f"{s.sessions} sessions started at {s.session_rate:g}/s; load guard "
        f"{'adaptive' if s.imbalance is None else f'fixed at {s.imbalance}'}. Sustainable "
        "rate: the "
        f"highest multiple of the base rate with TTFT p90 <= {s.slo_ttft_p90_ms:g} ms "
        f"(tried x1 and {', '.join(f'x{m:g}' for m in s.levels)}). tenants: arrivals at "
        f"x{s.tenants_load:g} the base rate, a KV cache of {s.tenants_kv_blocks} blocks per "
        "worker (two of the four documents)."
    ]
    for name in runs["fifo"]["workloads"]:
        rows = [
            [label, *(show(runs[p]["workloads"][name].get(key)) for p in POLICIES if p in runs)]
            for key, label, show in ROWS
        ]
        if name in ("shared", "chat"):
            rows.append(
                [
                    "sustainable rate (x base)",
                    *(f"x{_sustainable(s, runs[p], name):g}" for p in POLICIES if p in runs),
                ]
            )
        rows.append(
            [
                "guards fired",
                *(_guards(runs[p]["workloads"][name]["guards"]) for p in POLICIES if p in runs),
            ]
        )
        parts.append(f"**{name}**\n\n" + table(["", *(p for p in POLICIES if p in runs)], rows))
    guards = runs.get("guards", {})
    for name in GUARD_WORKLOADS:
        if not guards or name not in guards["adaptive"]:
            continue
        rows = [
            [label, *(show(g[name].get(key)) for g in guards.values())]
            for key, label, show in ROWS
            if key in GUARD_FIGURES
        ]
        parts.append(
            f"**{name}: `prefix` under each load guard** (medians of "
            f"{len(guards['adaptive'][name]['runs'])} runs, the guards in turn)\n\n"
            + table(["", *guards], rows)
        )
    parts += [target_line(t.description, t.met, t.detail) for t in targets]
    return "\n\n".join(parts)


def _guards(counts: dict[str, int]) -> str:
    shown = [f"{k.removeprefix('guard_')} {v}" for k, v in counts.items() if v]
    return ", ".join(shown) or "—"


def run(ctx: Context) -> ScenarioResult:
    s = QUICK if ctx.quick else Sizes()
    if os.environ.get("BENCH_ROUTING_IMBALANCE"):
        s = replace(s, imbalance=int(os.environ["BENCH_ROUTING_IMBALANCE"]))
    policies = tuple(p for p in POLICIES if not ctx.policies or p in ctx.policies)
    if "fifo" not in policies:
        policies = ("fifo", *policies)
    ctx.say("routing: FIFO's capacity on the shared workload")
    capacity = _calibrate(ctx, s)
    if capacity <= 0:
        raise BenchError("the calibration completed no request")
    rate = capacity * s.load
    plan = _plan(s, rate)
    chosen = os.environ.get("BENCH_ROUTING_WORKLOADS")
    if chosen:
        names = set(chosen.split(","))
        plan.base = {k: v for k, v in plan.base.items() if k in names}
        plan.levels = {k: v for k, v in plan.levels.items() if k in names}
    runs: dict[str, Any] = {p: _run_policy(ctx, s, p, plan) for p in policies}
    targets = _targets(s, runs) if "prefix" in runs else []
    if "prefix" in policies:
        ctx.say("routing: prefix under each load guard")
        runs["guards"] = _compare_guards(ctx, s, plan)
        targets += _guard_targets(runs["guards"])
    data = {"settings": asdict(s), "capacity_rps": capacity, "rate_rps": rate, "runs": runs}
    return ScenarioResult(
        "routing",
        "Routing: FIFO, least-loaded, first-block hash and cache-aware",
        data,
        _markdown(replace(s), rate, runs, targets),
        targets,
    )
