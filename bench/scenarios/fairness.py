"""Fair share among tenants: ``LLMQ_FAIRNESS=vtc`` beside ``fifo`` on the same arrivals.

On the mock's engine, 4 workers, tenants named by the trusted header (``X-Tenant``).
Each case runs each policy on a fresh stack with the same Poisson arrivals (same seed),
submitted through the native API (``POST /v1/requests``: the driver holds no streams),
and reads what happened from the requests' records when the arrivals end: *wait* is a
request's start minus its arrival (a request not started by then counts with its wait so
far); *served* the completion tokens of requests finished in the window.

- ``noisy``: tenant ``light`` at half its fair share, alone, then beside ``noisy`` at ten
  times its share: light's p99 TTFT (from its requests' ``first_token`` notes) beside
  noisy against alone (target: at most 1.25x), and its p99 wait beside it.
- ``bursty``: under the default settings, tenant ``bursty`` sending bursts of
  ``burst`` requests at once every ``burst_every_s`` (half its fair share on average),
  alone, then beside ``noisy`` at ten times its share: bursty's p99 TTFT beside noisy
  against alone (target: at most 2x).
- ``weights``: tenants of weight 3 and 1, both sending twice the pool's capacity: the
  ratio of tokens served (target 3 ± 10 %), and per 10 s window.
- ``lone``: one tenant at 1.5x capacity: its throughput (target: at least 98 % of fifo's).
- ``shed``: 1.5x capacity with ``LLMQ_SHED_WAIT_SECONDS``: the accepted requests' p99
  wait against the bound, and how fast refusals come back (target: p99 within 50 ms).
- ``tpm``: a tenant limited to N tokens per minute, offered 1.6 N through 4 API
  processes for 3 minutes: what it was admitted per minute (target 0.9 N to 1.05 N).
- ``light``: the light scenario's load (one worker, nothing queues) with tenants (the
  default settings, so ``vtc``, and the default tenant given limits: its quota taken and
  returned) and without (``LLMQ_FAIRNESS=fifo``, no limits), alternated: pickup (API
  accept to worker start) and TTFT medians (target: with tenants no more than 10 %
  slower, median of paired ratios).
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import time
from dataclasses import asdict, dataclass
from typing import Any

import httpx
from redis.asyncio import Redis

from bench import traffic
from bench.breakdown import pipeline_breakdown
from bench.procs import Stack
from bench.report import fmt, table, target_line
from bench.scenario import Context, ScenarioResult, Target, interleave
from bench.scenarios import light
from bench.stats import describe_ms, median_of, medians, paired_ratios
from llmq.protocol import keys
from llmq.tenants import Tenant, TenantStore


@dataclass(frozen=True)
class Sizes:
    workers: int = 4
    slots: int = 2
    output_tokens: int = 40
    tokens_per_second: float = 40.0
    duration_s: float = 30.0
    shed_bound_s: float = 4.0
    #: The quota case: a tenant's tokens per minute, through this many API processes.
    tpm: int = 30_000
    tpm_api_processes: int = 4
    tpm_duration_s: float = 180.0
    #: The bursty case: this many requests at once, every this many seconds.
    burst: int = 4
    burst_every_s: float = 2.0

    @property
    def capacity(self) -> float:
        """Requests per second the pool serves (each takes output / speed seconds)."""
        return self.workers * self.slots * self.tokens_per_second / self.output_tokens


QUICK = Sizes(
    duration_s=8.0, output_tokens=10, tokens_per_second=40.0, shed_bound_s=1.0, tpm_duration_s=20
)

POLICIES = ("fifo", "vtc")


@dataclass(frozen=True)
class Sent:
    tenant: str
    at: float
    request_id: str | None
    status: int
    answer_ms: float


async def _send(client: httpx.AsyncClient, tenant: str, body: dict[str, Any]) -> Sent:
    t0 = time.monotonic()
    r = await client.post("/v1/requests", json=body, headers={"X-Tenant": tenant})
    ms = (time.monotonic() - t0) * 1000
    rid = r.json().get("id") if r.status_code == 202 else None
    return Sent(tenant, time.time(), rid, r.status_code, ms)


async def _drive(
    url: str,
    s: Sizes,
    rates: dict[str, float],
    seed: int,
    duration: float | None = None,
    bursts: frozenset[str] = frozenset(),
) -> list[Sent]:
    """Poisson arrivals per tenant for ``duration`` (default ``s.duration_s``); a tenant
    in ``bursts`` sends ``s.burst`` at once every ``s.burst_every_s`` instead (its rate
    unused), from a random phase."""
    body = {
        "model": "mock",
        "prompt": "fair share",
        "max_tokens": s.output_tokens,
        "ignore_eos": True,
    }
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:
        tasks: list[asyncio.Task[Sent]] = []

        async def arrivals(tenant: str, rate: float, rng: random.Random) -> None:
            end = time.monotonic() + (duration or s.duration_s)
            while True:
                await asyncio.sleep(rng.expovariate(rate))
                if time.monotonic() >= end:
                    return
                tasks.append(asyncio.create_task(_send(client, tenant, body)))

        async def burst(tenant: str, rng: random.Random) -> None:
            end = time.monotonic() + (duration or s.duration_s)
            await asyncio.sleep(rng.uniform(0, s.burst_every_s))
            while time.monotonic() < end:
                for _ in range(s.burst):
                    tasks.append(asyncio.create_task(_send(client, tenant, body)))
                await asyncio.sleep(s.burst_every_s)

        await asyncio.gather(
            *(
                (burst if t in bursts else functools.partial(arrivals, rate=r))(
                    t, rng=random.Random(f"{seed}-{t}")
                )
                for t, r in rates.items()
            )
        )
        return list(await asyncio.gather(*tasks))


async def _first_tokens(redis: Redis) -> dict[str, float]:
    """Each request's time to first token (its first run's ``first_token`` note)."""
    pipe = redis.pipeline(transaction=False)
    for stream in keys.LIFECYCLES:
        pipe.xrange(stream)
    out: dict[str, float] = {}
    for entries in await pipe.execute():
        for _, note in entries:
            if note.get("event") == "first_token":
                ttft = json.loads(note["data"]).get("ttft_ms")
                if ttft is not None:
                    out.setdefault(note["request_id"], float(ttft))
    return out


async def _records(redis_url: str, sent: list[Sent]) -> list[dict[str, Any]]:
    redis = Redis.from_url(redis_url, decode_responses=True)
    pipe = redis.pipeline(transaction=False)
    accepted = [x for x in sent if x.request_id]
    for x in accepted:
        pipe.hgetall(keys.request(x.request_id or ""))
    found = await pipe.execute()
    ttfts = await _first_tokens(redis)
    await redis.aclose()
    now = time.time()
    out = []
    for x, rec in zip(accepted, found, strict=True):
        created = float(rec.get("created_at", x.at))
        started = float(rec["started_at"]) if "started_at" in rec else None
        finished = float(rec["finished_at"]) if "finished_at" in rec else None
        out.append(
            {
                "tenant": x.tenant,
                "created": created,
                "wait_ms": ((started or now) - created) * 1000,
                "ttft_ms": ttfts.get(x.request_id or ""),
                "finished": finished,
                "tokens": int(rec.get("completion_tokens") or 0) if finished else 0,
                "prompt_tokens": int(rec.get("prompt_tokens") or 0),
            }
        )
    return out


def _case(
    ctx: Context,
    s: Sizes,
    policy: str | None,
    tenants: list[Tenant],
    rates: dict[str, float],
    seed: int,
    api_env: dict[str, str] | None = None,
    duration: float | None = None,
    bursts: frozenset[str] = frozenset(),
) -> tuple[list[Sent], list[dict[str, Any]]]:
    """One stack, ``policy`` on every process (None: the default settings'), driven by
    the tenants' arrivals."""
    fairness = {} if policy is None else {"LLMQ_FAIRNESS": policy}
    env = {**fairness, "LLMQ_TENANT_HEADER": "X-Tenant"}
    env.update({"LLMQ_MAX_QUEUE_DEPTH": "20000", **(api_env or {})})
    worker_env = {
        **fairness,
        "LLMQ_CONCURRENCY": str(s.slots),
        "LLMQ_MODEL_TOKENS_PER_SECOND": str(s.tokens_per_second),
    }
    with Stack(ctx.log_dir, env) as stack:
        stack.scale(s.workers, worker_env)

        async def go() -> tuple[list[Sent], list[dict[str, Any]]]:
            redis = Redis.from_url(stack.redis.url)
            store = TenantStore(redis)
            for t in tenants:
                await store.put(t)
            await redis.aclose()
            sent = await _drive(stack.url, s, rates, seed, duration, bursts)
            return sent, await _records(stack.redis.url, sent)

        return asyncio.run(go())


def _waits(records: list[dict[str, Any]], tenant: str) -> dict[str, float | None]:
    return describe_ms([r["wait_ms"] for r in records if r["tenant"] == tenant])


def _p99(records: list[dict[str, Any]], tenant: str) -> float | None:
    return _waits(records, tenant)["p99"]


def _ttft_p99(records: list[dict[str, Any]], tenant: str) -> float | None:
    """p99 TTFT of the tenant's requests; one that had no first token yet counts as its
    wait so far (a lower bound), so a starved tenant cannot look fast."""
    return describe_ms(
        [
            r["ttft_ms"] if r["ttft_ms"] is not None else r["wait_ms"]
            for r in records
            if r["tenant"] == tenant
        ]
    )["p99"]


def _served(records: list[dict[str, Any]], tenant: str, lo: float, hi: float) -> int:
    return sum(
        r["tokens"]
        for r in records
        if r["tenant"] == tenant and r["finished"] and lo <= r["finished"] < hi
    )


def _noisy(ctx: Context, s: Sizes) -> dict[str, Any]:
    """Light alone, then beside noisy, per policy: ``vtc`` ``ctx.repeats`` times (a p99 of
    some 60 requests is nearly their slowest, so one pair of runs says little), ``fifo``
    once (its ratio is in the hundreds); medians over the pairs."""
    share = s.capacity / 2
    tenants = [Tenant(name="light"), Tenant(name="noisy")]
    out: dict[str, Any] = {}
    for policy in POLICIES:
        pairs = []
        for i in range(ctx.repeats if policy == "vtc" else 1):
            ctx.say(f"  noisy: {policy} ({i + 1})")
            _, alone = _case(ctx, s, policy, tenants, {"light": 0.5 * share}, 1 + i)
            rates = {"light": 0.5 * share, "noisy": 10 * share}
            _, both = _case(ctx, s, policy, tenants, rates, 1 + i)
            a, b = _ttft_p99(alone, "light"), _ttft_p99(both, "light")
            pairs.append(
                {
                    "light_ttft_p99_alone_ms": a,
                    "light_ttft_p99_beside_noisy_ms": b,
                    "light_wait_p99_alone_ms": _p99(alone, "light"),
                    "light_wait_p99_beside_noisy_ms": _p99(both, "light"),
                    "light_waits_beside_noisy_ms": _waits(both, "light"),
                    "ratio": None if not a or b is None else b / a,
                    "noisy_wait_p99_ms": _p99(both, "noisy"),
                }
            )
        keys_ = [k for k in pairs[0] if k != "light_waits_beside_noisy_ms"]
        out[policy] = {**medians(pairs, keys_), "runs": pairs}
    return out


def _bursty(ctx: Context, s: Sizes) -> dict[str, Any]:
    """Bursts of a tenant below its share, alone and beside a noisy tenant, under the
    default settings."""
    share = s.capacity / 2
    tenants = [Tenant(name="bursty"), Tenant(name="noisy")]
    bursts = frozenset({"bursty"})
    ctx.say("  bursty: default settings")
    _, alone = _case(ctx, s, None, tenants, {"bursty": 0}, 6, bursts=bursts)
    _, both = _case(ctx, s, None, tenants, {"bursty": 0, "noisy": 10 * share}, 6, bursts=bursts)
    a, b = _ttft_p99(alone, "bursty"), _ttft_p99(both, "bursty")
    return {
        "burst": s.burst,
        "every_s": s.burst_every_s,
        "share_used": s.burst / s.burst_every_s / share,
        "ttft_p99_alone_ms": a,
        "ttft_p99_beside_noisy_ms": b,
        "ttft_beside_noisy_ms": describe_ms(
            [r["ttft_ms"] or r["wait_ms"] for r in both if r["tenant"] == "bursty"]
        ),
        "ratio": None if not a or b is None else b / a,
    }


def _weights(ctx: Context, s: Sizes) -> dict[str, Any]:
    tenants = [Tenant(name="heavy", weight=3), Tenant(name="slight", weight=1)]
    rates = {"heavy": 2 * s.capacity, "slight": 2 * s.capacity}
    out: dict[str, Any] = {}
    for policy in POLICIES:
        ctx.say(f"  weights: {policy}")
        _, records = _case(ctx, s, policy, tenants, rates, 2)
        start = min(r["created"] for r in records)
        lo, hi = start + s.duration_s * 0.25, start + s.duration_s
        h, w = _served(records, "heavy", lo, hi), _served(records, "slight", lo, hi)
        windows = []
        t = lo
        while t + 10 <= hi:
            wh, ws = _served(records, "heavy", t, t + 10), _served(records, "slight", t, t + 10)
            windows.append(None if not ws else wh / ws)
            t += 10
        out[policy] = {"heavy": h, "slight": w, "ratio": h / w if w else None, "windows": windows}
    return out


def _lone(ctx: Context, s: Sizes) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for policy in POLICIES:
        ctx.say(f"  lone: {policy}")
        _, records = _case(ctx, s, policy, [Tenant(name="solo")], {"solo": 1.5 * s.capacity}, 3)
        start = min(r["created"] for r in records)
        tokens = _served(records, "solo", start, start + s.duration_s)
        out[policy] = {"tokens_per_s": tokens / s.duration_s}
    return out


def _shed(ctx: Context, s: Sizes) -> dict[str, Any]:
    env = {"LLMQ_SHED_WAIT_SECONDS": str(s.shed_bound_s)}
    ctx.say("  shed")
    sent, records = _case(ctx, s, "fifo", [Tenant(name="solo")], {"solo": 1.5 * s.capacity}, 4, env)
    refused = [x.answer_ms for x in sent if x.status == 429]
    started = [r["wait_ms"] for r in records]
    return {
        "bound_ms": s.shed_bound_s * 1000,
        "accepted": len(records),
        "refused": len(refused),
        "accepted_wait_p99_ms": describe_ms(started)["p99"],
        "refusal_ms_p99": describe_ms(refused)["p99"],
    }


def _tpm(ctx: Context, s: Sizes) -> dict[str, Any]:
    """A tenant limited to ``s.tpm`` tokens per minute, offered 1.6 times that through
    ``s.tpm_api_processes`` API processes: what it was admitted, per minute."""
    env = {"LLMQ_API_PROCESSES": str(s.tpm_api_processes)}
    cost = 2 + s.output_tokens  # the prompt "fair share" and max_tokens
    rate = 1.6 * s.tpm / 60 / cost
    ctx.say(f"  tpm: {s.tpm} tokens a minute, {rate:.1f} req/s offered")
    tenant = Tenant(name="metered", tokens_per_minute=s.tpm)
    sent, records = _case(
        ctx, s, "fifo", [tenant], {"metered": rate}, 5, env, duration=s.tpm_duration_s
    )
    admitted = sum(r["prompt_tokens"] + s.output_tokens for r in records)
    per_minute = admitted / (s.tpm_duration_s / 60)
    return {
        "limit": s.tpm,
        "duration_s": s.tpm_duration_s,
        "admitted_tokens": admitted,
        "per_minute": per_minute,
        "share_of_limit": per_minute / s.tpm,
        "refused": sum(1 for x in sent if x.status == 429),
    }


#: The light case's figures, and how far with tenants may lag without.
LIGHT_KEYS = ("accept_to_start_ms", "ttft_ms_median", "ttft_ms_p99")
LIGHT_TARGET = 1.10


def _light(ctx: Context) -> dict[str, Any]:
    """The light scenario's load with tenants and without, alternated (a stack each)."""
    s = light.QUICK if ctx.quick else light.Sizes()
    worker_env = {
        "LLMQ_CONCURRENCY": str(s.concurrency),
        "LLMQ_MODEL_TOKENS_PER_SECOND": str(s.tokens_per_second),
        "LLMQ_MODEL_PREFILL_SECONDS_PER_TOKEN": str(s.prefill_seconds_per_token),
    }
    tenant = Tenant(name="default", tokens_per_minute=10**8, requests_per_minute=10**6)
    logs = {name: ctx.log_dir / name for name in ("plain", "tenants")}
    for folder in logs.values():
        folder.mkdir(parents=True, exist_ok=True)
    with (
        Stack(logs["plain"], {"LLMQ_FAIRNESS": "fifo"}) as plain,
        Stack(logs["tenants"]) as ten,
    ):
        plain.scale(1, {**worker_env, "LLMQ_FAIRNESS": "fifo"})
        ten.scale(1, worker_env)

        async def limit() -> None:
            redis = Redis.from_url(ten.redis.url)
            await TenantStore(redis).put(tenant)
            await redis.aclose()

        asyncio.run(limit())

        def system(stack: Stack) -> Any:
            def go(i: int) -> dict[str, Any]:
                result = traffic.run(light._config(s, i, base_url=stack.url))
                return {
                    **traffic.figures(result),
                    **pipeline_breakdown(stack.redis.url, result.started_at),
                }

            return go

        runs = interleave(ctx, ctx.repeats, [("without", system(plain)), ("with", system(ten))])
    return {
        "runs": runs,
        "medians": {name: {k: median_of(rs, k) for k in LIGHT_KEYS} for name, rs in runs.items()},
        "ratios": {k: paired_ratios(runs["with"], runs["without"], k) for k in LIGHT_KEYS},
        "failed": {name: sum(r["failed"] or 0 for r in rs) for name, rs in runs.items()},
    }


def run(ctx: Context) -> ScenarioResult:
    s = QUICK if ctx.quick else Sizes()
    noisy, weights, lone, shed = _noisy(ctx, s), _weights(ctx, s), _lone(ctx, s), _shed(ctx, s)
    bursty, tpm, quiet = _bursty(ctx, s), _tpm(ctx, s), _light(ctx)
    rows = []
    for policy in POLICIES:
        n, w = noisy[policy], weights[policy]
        rows.append(
            [
                policy,
                f"{fmt(n['light_ttft_p99_alone_ms'])} / {fmt(n['light_ttft_p99_beside_noisy_ms'])}",
                fmt(n["ratio"], 2),
                f"{fmt(n['light_wait_p99_alone_ms'])} / {fmt(n['light_wait_p99_beside_noisy_ms'])}",
                fmt(w["ratio"], 2),
                " ".join(fmt(x, 2) for x in w["windows"]) or "—",
                fmt(lone[policy]["tokens_per_s"]),
            ]
        )
    vtc, fifo = noisy["vtc"], lone["fifo"]["tokens_per_s"]
    wr = weights["vtc"]["ratio"]
    bound = shed["bound_ms"]
    targets = [
        Target(
            "light tenant's p99 TTFT beside a noisy one at most 1.25x its p99 alone (vtc)",
            None if vtc["ratio"] is None else vtc["ratio"] <= 1.25,
            f"{fmt(vtc['ratio'], 2)}x",
        ),
        Target(
            f"a bursty tenant's p99 TTFT beside a noisy one at most 2x its p99 alone "
            f"(default settings; bursts of {s.burst} every {s.burst_every_s:g} s)",
            None if bursty["ratio"] is None else bursty["ratio"] <= 2,
            f"{fmt(bursty['ratio'], 2)}x: {fmt(bursty['ttft_p99_alone_ms'])} ms alone, "
            f"{fmt(bursty['ttft_p99_beside_noisy_ms'])} ms beside",
        ),
        Target(
            "weights 3:1 served 3 ± 10 % (vtc)",
            None if wr is None else 2.7 <= wr <= 3.3,
            fmt(wr, 2),
        ),
        Target(
            "a lone tenant's throughput at least 98 % of fifo's (vtc)",
            None if not fifo else lone["vtc"]["tokens_per_s"] >= 0.98 * fifo,
            f"{fmt(lone['vtc']['tokens_per_s'])} vs {fmt(fifo)} tokens/s",
        ),
        Target(
            "shedding: accepted p99 wait within 10 % of the bound",
            None
            if shed["accepted_wait_p99_ms"] is None
            else shed["accepted_wait_p99_ms"] <= 1.1 * bound,
            f"{fmt(shed['accepted_wait_p99_ms'])} ms against {fmt(bound)} ms",
        ),
        Target(
            f"a tenant limited to N tokens a minute through {s.tpm_api_processes} API processes "
            f"gets 0.9 N to 1.05 N over {s.tpm_duration_s:g} s",
            0.9 <= tpm["share_of_limit"] <= 1.05,
            f"{fmt(tpm['per_minute'], 0)} a minute of {s.tpm}",
        ),
        Target(
            "shedding: refusals answered within 50 ms (p99)",
            None if shed["refusal_ms_p99"] is None else shed["refusal_ms_p99"] <= 50,
            f"{fmt(shed['refusal_ms_p99'])} ms, {shed['refused']} refused",
        ),
        *(
            Target(
                f"light load: {label} with tenants within {LIGHT_TARGET - 1:.0%} of without",
                None if r is None else r <= LIGHT_TARGET,
                f"ratio {fmt(r, 2)}; {fmt(quiet['medians']['with'][k], 2)} ms with, "
                f"{fmt(quiet['medians']['without'][k], 2)} ms without",
            )
            for k, label in (("accept_to_start_ms", "pickup"), ("ttft_ms_median", "median TTFT"))
            for r in [quiet["ratios"][k]["median"]]
        ),
    ]
    md = "\n\n".join(
        [
            f"Mock engine, {s.workers} workers x {s.slots} slots, {s.output_tokens} tokens at "
            f"{s.tokens_per_second:g} tok/s (capacity {s.capacity:g} req/s); {s.duration_s:g} s "
            "of Poisson arrivals per run, the same arrivals for each policy; one run per line, "
            f"but the light tenant beside a noisy one under vtc: medians of {ctx.repeats} pairs "
            "of runs (alone, beside).",
            table(
                [
                    "policy",
                    "light p99 TTFT alone / beside noisy (ms)",
                    "ratio",
                    "light p99 wait alone / beside noisy (ms)",
                    "served 3:1",
                    "per 10 s",
                    "lone tokens/s",
                ],
                rows,
            ),
            *(target_line(t.description, t.met, t.detail) for t in targets),
        ]
    )
    data = {
        "settings": asdict(s),
        "noisy": noisy,
        "weights": weights,
        "lone": lone,
        "shed": shed,
        "bursty": bursty,
        "tpm": tpm,
        "light": quiet,
    }
    return ScenarioResult("fairness", "Fair share among tenants", data, md, targets)
