"""``/metrics`` in Prometheus text format: cluster totals plus gauges taken at scrape time.

The figures are not this process's: they are the totals every process flushed to
Redis (:mod:`llmq.metrics`), so any API replica answers for the whole cluster and
Prometheus may scrape one replica or all of them (then aggregate with ``max``,
not ``sum``). A custom collector on a private registry renders them, so nothing
of prometheus_client's global state is involved.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector
from redis.asyncio import Redis

from api.totals import Totals, read_totals
from llmq import metrics, registry
from llmq.autoscale.state import autoscaled
from llmq.protocol import keys
from llmq.protocol.depth import queue_depth, queued_by_priority
from llmq.schema import ScaleState, WorkerInfo

QUEUE_DEPTH = "llmq_queue_depth"
QUEUE_DEPTH_BY_PRIORITY = "llmq_queue_depth_by_priority"
WORKER_RUNNING = "llmq_worker_running_requests"
LIVE_WORKERS = "llmq_live_workers"
CAPACITY = "llmq_capacity_requests"
RUNNING = "llmq_running_requests"
UTILIZATION = "llmq_utilization_ratio"
DESIRED_WORKERS = "llmq_autoscaler_desired_workers"
ACTUAL_WORKERS = "llmq_autoscaler_actual_workers"
MAX_WORKERS = "llmq_autoscaler_max_workers"
BATCHES_ACTIVE = "llmq_batches_active"
REDIS_UP = "llmq_redis_up"
KV_CACHE_USAGE = "llmq_worker_kv_cache_usage_ratio"
#: Counters per live worker (since it started), beside the cluster's per model.
WORKER_CACHE_QUERIES = "llmq_worker_prefix_cache_queries"
WORKER_CACHE_HITS = "llmq_worker_prefix_cache_hits"

#: Names of the scrape-time gauges, for tests and dashboards.
GAUGES = (
    QUEUE_DEPTH,
    QUEUE_DEPTH_BY_PRIORITY,
    WORKER_RUNNING,
    LIVE_WORKERS,
    CAPACITY,
    RUNNING,
    UTILIZATION,
    DESIRED_WORKERS,
    ACTUAL_WORKERS,
    MAX_WORKERS,
    BATCHES_ACTIVE,
    REDIS_UP,
    KV_CACHE_USAGE,
)


@dataclass(frozen=True)
class Scrape:
    totals: Totals
    workers: list[WorkerInfo]
    depths: dict[str, int]
    priorities: dict[str, dict[int, int]]
    scaled: dict[str, ScaleState] = field(default_factory=dict)
    batches_active: int = 0


async def scrape(redis: Redis, worker_ttl: float, extra_models: frozenset[str]) -> Scrape:
    """Everything ``/metrics`` shows, read from Redis (a few round trips)."""
    totals = await read_totals(redis)
    workers = await registry.live_workers(redis, worker_ttl)
    models = sorted(totals.models() | {w.model for w in workers} | extra_models)
    depths = {m: await queue_depth(redis, m) for m in models}
    priorities = {m: await queued_by_priority(redis, m) for m in models if depths[m]}
    scaled = await autoscaled(redis)
    batches_active = int(await redis.zcard(keys.BATCHES_ACTIVE))
    return Scrape(totals, workers, depths, priorities, scaled, batches_active)


class ClusterCollector(Collector):
    def __init__(self, data: Scrape) -> None:
        self.data = data

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily]:
        totals = self.data.totals
        for counter in metrics.COUNTERS:
            c = CounterMetricFamily(counter.name, counter.help, labels=counter.labels)
            for labels, value in sorted(totals.counters.get(counter.name, {}).items()):
                c.add_metric(list(labels), value)
            yield c
        for hist in metrics.HISTOGRAMS:
            h = HistogramMetricFamily(hist.name, hist.help, labels=hist.labels)
            for labels, series in sorted(totals.histograms.get(hist.name, {}).items()):
                counts = [n for _, n in series.cumulative(hist.buckets)]
                buckets = list(zip(hist.bounds, counts, strict=True))
                h.add_metric(list(labels), buckets, series.sum)
            yield h
        yield from self._gauges()
        yield from self._worker_caches()

    def _gauges(self) -> Iterator[GaugeMetricFamily]:
        data = self.data
        depth = GaugeMetricFamily(QUEUE_DEPTH, "Requests waiting per model.", labels=["model"])
        for model, n in data.depths.items():
            depth.add_metric([model], n)
        yield depth
        by_priority = GaugeMetricFamily(
            QUEUE_DEPTH_BY_PRIORITY,
            "Requests waiting per model and priority.",
            labels=["model", "priority"],
        )
        for model, counts in data.priorities.items():
            for priority, n in sorted(counts.items()):
                by_priority.add_metric([model, str(priority)], n)
        yield by_priority
        per_worker = GaugeMetricFamily(
            WORKER_RUNNING, "Requests running on each live worker.", labels=["worker", "model"]
        )
        for w in data.workers:
            per_worker.add_metric([w.id, w.model], w.running)
        yield per_worker
        live = GaugeMetricFamily(LIVE_WORKERS, "Live workers per model.", labels=["model"])
        capacity = GaugeMetricFamily(
            CAPACITY, "Sum of live workers' concurrency per model.", labels=["model"]
        )
        running = GaugeMetricFamily(RUNNING, "Requests running per model.", labels=["model"])
        utilization = GaugeMetricFamily(
            UTILIZATION, "Running / capacity per model (0 without workers).", labels=["model"]
        )
        for model in data.depths:
            mine = [w for w in data.workers if w.model == model]
            cap = sum(w.concurrency for w in mine)
            busy = sum(w.running for w in mine)
            live.add_metric([model], len(mine))
            capacity.add_metric([model], cap)
            running.add_metric([model], busy)
            utilization.add_metric([model], busy / cap if cap else 0.0)
        yield from (live, capacity, running, utilization)
        desired = GaugeMetricFamily(
            DESIRED_WORKERS, "Workers the autoscaler wants per model.", labels=["model"]
        )
        actual = GaugeMetricFamily(
            ACTUAL_WORKERS, "Live workers the autoscaler counts per model.", labels=["model"]
        )
        most = GaugeMetricFamily(
            MAX_WORKERS, "The most workers the autoscaler may order per model.", labels=["model"]
        )
        for model, state in sorted(data.scaled.items()):
            desired.add_metric([model], state.desired)
            actual.add_metric([model], state.actual)
            most.add_metric([model], state.max_workers)
        yield from (desired, actual, most)
        yield GaugeMetricFamily(
            BATCHES_ACTIVE,
            "Batches not ended yet (validating to finalizing).",
            value=data.batches_active,
        )
        yield redis_up(True)

    def _worker_caches(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        """Each live worker's KV cache, as vLLM exposes its own (the cluster's prefix cache
        totals per model are counters of :mod:`llmq.metrics`)."""
        labels = ["worker", "model"]
        usage = GaugeMetricFamily(
            KV_CACHE_USAGE,
            "Fraction of each live worker's KV cache that running requests hold.",
            labels=labels,
        )
        queries = CounterMetricFamily(
            WORKER_CACHE_QUERIES,
            "Prompt tokens each live worker looked up in its prefix cache.",
            labels=labels,
        )
        hits = CounterMetricFamily(
            WORKER_CACHE_HITS, "Prompt tokens each live worker found cached.", labels=labels
        )
        for w in self.data.workers:
            if w.kv_cache_usage is not None:
                usage.add_metric([w.id, w.model], w.kv_cache_usage)
            queries.add_metric([w.id, w.model], w.prefix_cache_queries)
            hits.add_metric([w.id, w.model], w.prefix_cache_hits)
        yield from (usage, queries, hits)


def redis_up(up: bool) -> GaugeMetricFamily:
    """1 when this answer was read from Redis; a scrape while Redis is away gets only
    this gauge, at 0, so that an alert can tell Redis away from the API away."""
    return GaugeMetricFamily(
        REDIS_UP, "Whether this API replica reached Redis for this scrape.", value=float(up)
    )


class RedisDown(Collector):
    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield redis_up(False)


def render(data: Scrape | None) -> bytes:
    """The exposition of ``data``, or of Redis being away when there is none."""
    registry_ = CollectorRegistry(auto_describe=False)
    registry_.register(ClusterCollector(data) if data is not None else RedisDown())
    return generate_latest(registry_)
