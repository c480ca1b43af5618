"""Queue wait at light load: a stock arq worker and a bare Redis hop against llmq's
parked worker.

Stock arq finds work by polling every ``poll_delay`` (0.5 s): a job enqueued
just after a poll waits for the next one. llmq's idle worker is parked, so the
API's enqueue script claims the request for it and publishes it on the worker's
own channel: one message, no claim round trip. That message is a hop no hand-off
through Redis avoids, so a third system is the hop alone: one PUBLISH to an idle
subscriber in another process (:mod:`bench.redis_hop`); what llmq takes beyond it
is its own work (the API's scripts, the worker's start of the run). All three get
the same spacing of arrivals (uniform 100-300 ms, seeded per repeat), so no job
ever waits for a slot and the figure is the pickup alone:

* stock arq: ``job start - time.time() just before ArqRedis.enqueue_job``;
* the bare hop: ``receipt - time.time() just before PUBLISH``;
* llmq: ``queue_ms`` of ``GET /v1/requests/{id}`` (worker start - API accept),
  for requests submitted through the native API.

All run against the same Redis; their keys do not overlap. ``--policies prefix``
(or another routing policy) runs llmq's side under that ``LLMQ_ROUTING``; several
(``--policies fifo,prefix``) run it under each in turn on the same processes
(:mod:`bench.policy_turns`).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

import httpx
from arq.connections import ArqRedis, RedisSettings, create_pool

from bench import policy_turns, redis_hop
from bench.procs import BenchError, BenchProcess, Stack, clean_env
from bench.report import fmt, table, target_line
from bench.scenario import Context, ScenarioResult, Target, interleave
from bench.stats import describe_ms, median_of, paired_differences, paired_ratios
from bench.stock_arq import JOB

WAITS_KEY = "bench:pickup:waits"
WARM_KEY = "bench:pickup:warm"
TARGET_MS = 3.0
FINAL = ("done", "failed", "cancelled")


@dataclass(frozen=True)
class Sizes:
    jobs: int = 40
    warmup: int = 3
    gap_low_s: float = 0.1
    gap_high_s: float = 0.3
    max_tokens: int = 2


QUICK = Sizes(jobs=8, warmup=1)


def _gaps(s: Sizes, seed: int, count: int) -> list[float]:
    rng = random.Random(seed)
    return [rng.uniform(s.gap_low_s, s.gap_high_s) for _ in range(count)]


async def _waits(
    pool: ArqRedis, key: str, gaps: list[float], send: Callable[[], Awaitable[Any]], who: str
) -> list[float]:
    """Send one job per gap, then wait until each has recorded its wait (ms) in ``key``."""
    await pool.delete(key)
    for gap in gaps:
        await send()
        await asyncio.sleep(gap)
    deadline = time.monotonic() + 30
    while await pool.llen(key) < len(gaps):  # type: ignore[misc]
        if time.monotonic() > deadline:
            raise BenchError(f"{who} did not record every wait within 30 s")
        await asyncio.sleep(0.05)
    values = await pool.lrange(key, 0, -1)  # type: ignore[misc]
    return [float(v) * 1000.0 for v in values]


#: One timed send on a pool: the job (or message) whose wait is recorded in a key.
Send = Callable[[ArqRedis, str], Awaitable[Any]]


async def _timed(
    redis_url: str, s: Sizes, seed: int, who: str, keys: tuple[str, str], send: Send
) -> list[float]:
    """A warm-up into ``keys[0]``, then one send per seeded gap into ``keys[1]``."""
    pool = await create_pool(RedisSettings.from_dsn(redis_url))
    warm, measured = keys
    try:
        await _waits(pool, warm, [0.05] * s.warmup, lambda: send(pool, warm), who)
        return await _waits(
            pool, measured, _gaps(s, seed, s.jobs), lambda: send(pool, measured), who
        )
    finally:
        await pool.aclose()


async def _stock(redis_url: str, s: Sizes, seed: int) -> list[float]:
    def job(pool: ArqRedis, key: str) -> Awaitable[Any]:
        return pool.enqueue_job(JOB, key, time.time())

    return await _timed(redis_url, s, seed, "the stock arq worker", (WARM_KEY, WAITS_KEY), job)


async def _hop(redis_url: str, s: Sizes, seed: int) -> list[float]:
    def message(pool: ArqRedis, _: str) -> Awaitable[Any]:
        return pool.publish(redis_hop.CHANNEL, repr(time.time()))

    hop_keys = (redis_hop.WAITS_KEY, redis_hop.WAITS_KEY)
    return await _timed(redis_url, s, seed, "the Redis hop's subscriber", hop_keys, message)


async def _submit(client: httpx.AsyncClient, s: Sizes, n: int) -> str:
    body = {"model": "mock", "prompt": f"pickup probe {n}", "max_tokens": s.max_tokens}
    response = await client.post("/v1/requests", json=body)
    if response.status_code != 202:
        raise BenchError(f"POST /v1/requests answered {response.status_code}: {response.text}")
    rid: str = response.json()["id"]
    return rid


async def _queue_ms(client: httpx.AsyncClient, rid: str) -> float:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        record = (await client.get(f"/v1/requests/{rid}")).json()
        if record.get("status") in FINAL:
            if record.get("queue_ms") is None:
                raise BenchError(f"request {rid} ended {record.get('status')} without queue_ms")
            return float(record["queue_ms"])
        await asyncio.sleep(0.05)
    raise BenchError(f"request {rid} did not finish within 30 s")


async def _ours(url: str, s: Sizes, seed: int) -> list[float]:
    async with httpx.AsyncClient(base_url=url, timeout=10.0) as client:
        for n in range(s.warmup):
            await _queue_ms(client, await _submit(client, s, -1 - n))
        ids = []
        for n, gap in enumerate(_gaps(s, seed, s.jobs)):
            ids.append(await _submit(client, s, n))
            await asyncio.sleep(gap)
        return [await _queue_ms(client, rid) for rid in ids]


def _figures(waits_ms: list[float]) -> dict[str, Any]:
    stats = describe_ms(waits_ms)
    return {**{f"wait_ms_{k}": v for k, v in stats.items()}, "waits_ms": waits_ms}


def run(ctx: Context) -> ScenarioResult:
    s = QUICK if ctx.quick else Sizes()
    routing = policy_turns.routing_policies(ctx.policies)
    env = {"LLMQ_ROUTING": routing[0]} if len(routing) == 1 else {}
    with Stack(ctx.log_dir, api_env=env) as stack:
        stack.scale(1, env)
        url = stack.redis.url
        arq = BenchProcess("stock-arq", ["bench.stock_arq", url], clean_env(), ctx.log_dir)
        hop = BenchProcess("redis-hop", ["bench.redis_hop", url], clean_env(), ctx.log_dir)
        try:

            def stock(i: int) -> dict[str, Any]:
                if not arq.running():
                    raise BenchError(f"the stock arq worker exited:\n{arq.tail()}")
                return _figures(asyncio.run(_stock(url, s, i)))

            def bare(i: int) -> dict[str, Any]:
                if not hop.running():
                    raise BenchError(f"the Redis hop's subscriber exited:\n{hop.tail()}")
                return _figures(asyncio.run(_hop(url, s, i)))

            def ours(i: int) -> dict[str, Any]:
                def once(seed: int) -> dict[str, Any]:
                    return _figures(asyncio.run(_ours(stack.url, s, seed)))

                if len(routing) > 1:
                    return policy_turns.in_turns(url, routing, i, once)
                return once(i)

            systems = [("stock_arq", stock), ("redis_hop", bare), ("llmq", ours)]
            runs = interleave(ctx, ctx.repeats, systems)
        finally:
            arq.stop()
            hop.stop()
    keys = ("wait_ms_median", "wait_ms_p90", "wait_ms_p99", "wait_ms_max")
    med = {name: {k: median_of(rs, k) for k in keys} for name, rs in runs.items()}
    ratios = {k: paired_ratios(runs["stock_arq"], runs["llmq"], k) for k in keys}
    above = {k: paired_differences(runs["llmq"], runs["redis_hop"], k) for k in keys}
    ours_median = med["llmq"]["wait_ms_median"]
    target = Target(
        f"llmq median queue wait <= {TARGET_MS:g} ms",
        None if ours_median is None else ours_median <= TARGET_MS,
        f"llmq {fmt(ours_median, 2)} ms, stock arq {fmt(med['stock_arq']['wait_ms_median'])} ms, "
        f"a bare Redis hop {fmt(med['redis_hop']['wait_ms_median'], 2)} ms",
    )
    rows = [
        [
            k.removeprefix("wait_ms_"),
            fmt(med["stock_arq"][k]),
            fmt(med["redis_hop"][k], 2),
            fmt(med["llmq"][k], 2),
            fmt(above[k], 2),
            fmt(ratios[k]["median"], 0) + "x" if ratios[k]["median"] else "—",
        ]
        for k in keys
    ]
    head = [
        "wait (ms)",
        "stock arq (poll 0.5 s)",
        "bare Redis hop",
        "llmq (hand-off)",
        "llmq - hop",
        "arq / llmq",
    ]
    turns = None
    if len(routing) > 1:
        labels = {"wait_ms_median": "median wait (ms)", "wait_ms_p90": "p90 wait (ms)"}
        turns = policy_turns.by_policy(runs["llmq"], routing, labels)
    md = "\n\n".join(
        [
            f"{s.jobs} jobs per run, arrivals spaced uniformly {s.gap_low_s * 1000:.0f}-"
            f"{s.gap_high_s * 1000:.0f} ms; wait = job start - enqueue (ms); medians of "
            f"{ctx.repeats} interleaved runs (each statistic is per run, then the median; "
            "llmq - hop: the median of the per-run differences). The bare hop is one "
            "PUBLISH to an idle subscriber on uvloop (`bench/redis_hop.py`): the floor "
            "of any hand-off through Redis on this machine.",
            table(head, rows),
            target_line(target.description, target.met, target.detail),
            *([turns["md"]] if turns else []),
        ]
    )
    data = {
        "settings": asdict(s),
        "runs": runs,
        "medians": med,
        "ratios": ratios,
        "above_hop_ms": above,
        "by_policy": turns["data"] if turns else None,
    }
    return ScenarioResult("pickup", "Pickup: queue wait at light load", data, md, [target])
