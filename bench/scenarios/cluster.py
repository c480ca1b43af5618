"""Token events per second and concurrent streams held on a Redis Cluster of 1 and 3 shards.

The API and the workers are the same processes as on a single Redis, pointed at a
local Redis Cluster (``redis+cluster://``, :mod:`rigs.embedded_cluster`) of one
primary holding all 16384 slots, or three primaries holding a third each (no
replicas: what is measured is where the writes go). A closed loop of N streaming
users at the model's pace runs level by level, the shard counts taking turns at
each level (1, 3, 1, 3...) so that a noisy neighbour hits both.

Per run: stream entries written per second (``XADD`` calls over the run, summed
over the primaries: token events plus the few others), output tokens per second,
ITL p99, failures, and CPU seconds per process (API, workers, each Redis node). A
level is *held* when every request succeeds and the ITL p99 (median over the
repeats) stays within 3 x the model's token interval; the streams held are the
highest level held before the first that is not.

A model's queue lives on one shard, so claims and hand-offs do not spread; token
traffic does, by request group. On a machine whose cores the API, the workers
and the load generator already fill, more shards cannot add throughput: the
figures then say what the cluster costs, not what it gains.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import redis

from bench import traffic
from bench.procs import Stack
from bench.report import fmt, table
from bench.scenario import Context, ScenarioResult, Target
from bench.scenarios.capacity import worker_env
from bench.stats import median, median_of
from bench.sysinfo import CpuMeter
from llmq.embedded import EmbeddedRedis
from rigs.embedded_cluster import EmbeddedCluster

#: Loose: the machine these figures come from is shared, so its ITL is noisy.
ITL_FACTOR = 3.0


@dataclass(frozen=True)
class Sizes(traffic.Requests):
    shards: tuple[int, ...] = (1, 3)
    levels: tuple[int, ...] = (25, 50, 100, 150, 200, 300, 400)
    workers: int = 2
    duration_s: float = 6.0
    output_tokens: int = 150


QUICK = Sizes(levels=(10, 20), duration_s=1.5, output_tokens=20)


class ClusterStack(Stack):
    """:class:`bench.procs.Stack` (one API, resizable workers) on a Redis Cluster."""

    def __init__(self, log_dir: Path, shards: int) -> None:
        super().__init__(log_dir)
        self.cluster = EmbeddedCluster(primaries=shards, replicas=0)
        # Stack starts, names and stops its Redis through start(), url and stop()
        self.redis = cast(EmbeddedRedis, self.cluster)

    def pids(self) -> dict[str, int]:
        out = {c.name: c.pid for c in self.workers}
        if self.api is not None:
            out["api"] = self.api.pid
        for i, pid in enumerate(self.cluster.pids()):
            out[f"shard-{i}"] = pid
        return out


def xadds(cluster: EmbeddedCluster) -> int:
    """``XADD`` calls so far, summed over the nodes (script calls included)."""
    total = 0
    for node in cluster.nodes:
        client = redis.Redis(port=node.port)
        try:
            stats = cast(dict[str, Any], client.info("commandstats"))
        finally:
            client.close()
        total += int(stats.get("cmdstat_xadd", {}).get("calls", 0))
    return total


def _once(stack: ClusterStack, s: Sizes, users: int, seed: int) -> dict[str, Any]:
    stack.scale(s.workers, worker_env(s, users))
    config = s.load(
        seed, timeout=120.0, base_url=stack.url, concurrency=users, duration=s.duration_s
    )
    meter = CpuMeter({**stack.pids(), "loadgen": os.getpid()}, None).start()
    written, started = xadds(stack.cluster), time.monotonic()
    result = traffic.run(config)
    wall = time.monotonic() - started
    written = xadds(stack.cluster) - written
    cpu = meter.stop()
    out = traffic.figures(result)
    out["stream_entries_per_s"] = written / wall if wall > 0 else None
    out["cpu"] = cpu
    out["redis_cpu_s"] = sum(v for k, v in cpu.items() if k.startswith("shard-"))
    out["errors"] = traffic.first_errors(result)
    return out


def run(ctx: Context) -> ScenarioResult:
    s = QUICK if ctx.quick else Sizes()
    interval_ms = 1000.0 / s.tokens_per_second
    runs: dict[int, dict[int, list[dict[str, Any]]]] = {n: {} for n in s.shards}
    stacks = {n: ClusterStack(ctx.log_dir, n) for n in s.shards}
    held: dict[int, int] = dict.fromkeys(s.shards, 0)
    failing: set[int] = set()
    try:
        for stack in stacks.values():
            stack.__enter__()
        for users in s.levels:
            for i in range(ctx.repeats):
                for n in s.shards:
                    if n in failing:
                        continue
                    ctx.say(f"  {n} shard(s), {users} users, run {i + 1}/{ctx.repeats}")
                    runs[n].setdefault(users, []).append(_once(stacks[n], s, users, i))
            for n in s.shards:
                level = runs[n].get(users)
                if n in failing or not level:
                    continue
                itl = median_of(level, "itl_ms_p99")
                ok = all(not r["failed"] for r in level) and itl is not None
                if ok and itl is not None and itl <= ITL_FACTOR * interval_ms:
                    held[n] = users
                else:
                    failing.add(n)
            if len(failing) == len(s.shards):
                break
    finally:
        for stack in stacks.values():
            stack.close()
    rows: list[list[str]] = []
    summary: dict[int, dict[int, dict[str, Any]]] = {}
    for n in s.shards:
        for users, level in sorted(runs[n].items()):
            row = {
                "stream_entries_per_s": median_of(level, "stream_entries_per_s"),
                "output_throughput": median_of(level, "output_throughput"),
                "itl_ms_p99": median_of(level, "itl_ms_p99"),
                "failed": sum(r["failed"] or 0 for r in level),
                "redis_cpu_s": median(r["redis_cpu_s"] for r in level),
                "machine_utilisation": median(r["cpu"]["machine_utilisation"] for r in level),
            }
            summary.setdefault(n, {})[users] = row
            rows.append(
                [
                    str(n),
                    str(users),
                    fmt(row["stream_entries_per_s"], 0),
                    fmt(row["output_throughput"], 0),
                    fmt(row["itl_ms_p99"]),
                    str(row["failed"]),
                    fmt(row["redis_cpu_s"], 2),
                    fmt(row["machine_utilisation"], 2),
                ]
            )
    md = "\n\n".join(
        [
            f"Closed loop, {s.workers} workers of N/{s.workers} slots, prompt "
            f"{s.prompt_tokens} / output {s.output_tokens} tokens at "
            f"{s.tokens_per_second:g} tok/s for {s.duration_s:g} s per run, median over "
            f"{ctx.repeats}; a level is held with no failure and ITL p99 <= "
            f"{ITL_FACTOR:g} x {interval_ms:g} ms. Streams held: "
            + ", ".join(f"{n} shard(s) {held[n]}" for n in s.shards)
            + f". Machine: {os.cpu_count()} cores shared by every process.",
            table(
                [
                    "shards",
                    "users",
                    "stream entries/s",
                    "output tok/s",
                    "ITL p99 (ms)",
                    "failed",
                    "Redis CPU s (all shards)",
                    "machine CPU",
                ],
                rows,
            ),
        ]
    )
    data = {"settings": asdict(s), "runs": runs, "summary": summary, "held": held}
    targets = [
        Target(
            "the same API and workers hold streams on 1 and 3 shards",
            all(held[n] > 0 for n in s.shards),
            ", ".join(f"{n} shard(s): {held[n]} streams" for n in s.shards),
        )
    ]
    return ScenarioResult("cluster", "Redis Cluster: 1 and 3 shards", data, md, targets)
