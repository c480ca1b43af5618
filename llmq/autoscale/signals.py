"""What the autoscaler reads from the cluster: queue, running set, registry, metric totals.

Nothing here is new state: the queue and running set are the model's own keys,
the workers are the registry, and rates and latencies are differences between
snapshots of the cluster-wide metric totals that every process flushes
(:mod:`llmq.metrics`). The arrival rate is what entered the system: completions
plus the growth of queued + running over the window (conservation), so it needs
no per-request counter of its own.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from redis.asyncio import Redis

from llmq import keys, metrics, registry
from llmq.queue import as_str
from llmq.schema import WorkerInfo

#: Finished outcomes that left the system (a 429 never entered it).
_LEFT = frozenset({"stop", "length", "cancelled", "timeout", "error"})


@dataclass(frozen=True)
class Snapshot:
    at: float
    queued: int
    running: int
    completed: float
    #: (sum, count) of prefill + decode seconds, cumulative.
    service: tuple[float, float]
    #: Per-bucket (not cumulative) counts of TTFT and TPOT, cumulative over time.
    ttft: dict[float, float] = field(default_factory=dict)
    tpot: dict[float, float] = field(default_factory=dict)
    workers: tuple[WorkerInfo, ...] = ()


def quantile(deltas: dict[float, float], q: float) -> float | None:
    """The ``q`` quantile from per-bucket counts (the bucket's upper bound), or None."""
    total = sum(deltas.values())
    if total <= 0:
        return None
    running = 0.0
    for bound in sorted(deltas):
        running += deltas[bound]
        if running >= q * total:
            return bound
    return max(deltas)


def _diff(new: dict[float, float], old: dict[float, float]) -> dict[float, float]:
    return {b: n - old.get(b, 0.0) for b, n in new.items() if n - old.get(b, 0.0) > 0}


async def _totals(
    redis: Redis, model: str
) -> tuple[float, tuple[float, float], dict[str, dict[float, float]]]:
    families: tuple[metrics.Family, ...] = (
        metrics.REQUESTS,
        metrics.PREFILL_TIME,
        metrics.DECODE_TIME,
        metrics.TTFT,
        metrics.TPOT,
    )
    pipe = redis.pipeline(transaction=False)
    for family in families:
        pipe.hgetall(keys.metric(family.name))
    replies = await pipe.execute()
    completed = 0.0
    service_sum = service_count = 0.0
    buckets: dict[str, dict[float, float]] = {metrics.TTFT.name: {}, metrics.TPOT.name: {}}
    for family, reply in zip(families, replies, strict=True):
        for raw, value in reply.items():
            parsed = metrics.parse_field(as_str(raw))
            if parsed is None or not parsed[1] or parsed[1][0] != model:
                continue
            kind, labels = parsed
            amount = float(value)
            if family is metrics.REQUESTS:
                if len(labels) == 2 and labels[1] in _LEFT:
                    completed += amount
            elif family in (metrics.PREFILL_TIME, metrics.DECODE_TIME):
                if kind == "sum":
                    service_sum += amount
                elif kind == "count" and family is metrics.DECODE_TIME:
                    service_count += amount
            elif kind not in ("sum", "count"):
                try:
                    bound = float(kind)
                except ValueError:
                    continue
                buckets[family.name][bound] = amount
    return completed, (service_sum, service_count), buckets


class ClusterProbe:
    """One model's signals, with the few snapshots that rates and recent latencies need."""

    def __init__(
        self,
        redis: Redis,
        model: str,
        *,
        worker_ttl: float,
        rate_window: float = 10.0,
        recent_window: float = 2.0,
        latency_window: float = 10.0,
    ) -> None:
        self.redis = redis
        self.model = model
        self.worker_ttl = worker_ttl
        self.rate_window = rate_window
        self.recent_window = recent_window
        self.latency_window = latency_window
        self._history: deque[Snapshot] = deque()

    async def snapshot(self) -> Snapshot:
        pipe = self.redis.pipeline(transaction=False)
        pipe.zcard(keys.queue(self.model))
        pipe.zcard(keys.running(self.model))
        queued, running = await pipe.execute()
        workers = await registry.live_workers(self.redis, self.worker_ttl)
        completed, service, buckets = await _totals(self.redis, self.model)
        snap = Snapshot(
            at=time.monotonic(),
            queued=int(queued),
            running=int(running),
            completed=completed,
            service=service,
            ttft=buckets[metrics.TTFT.name],
            tpot=buckets[metrics.TPOT.name],
            workers=tuple(w for w in workers if w.model == self.model),
        )
        self._history.append(snap)
        keep = max(self.rate_window, self.latency_window) + 2
        while len(self._history) > 2 and snap.at - self._history[1].at > keep:
            self._history.popleft()
        return snap

    def _since(self, window: float) -> Snapshot:
        now = self._history[-1].at
        for snap in self._history:
            if now - snap.at <= window:
                return snap
        return self._history[-1]

    def arrival_rate(self, window: float | None = None) -> float:
        """Requests per second that entered over ``window`` (default: the rate window;
        the law also reads the recent window, where a rise shows first)."""
        new, old = self._history[-1], self._since(window or self.rate_window)
        span = new.at - old.at
        if span <= 0:
            return 0.0
        entered = (
            (new.completed - old.completed)
            + (new.queued + new.running)
            - (old.queued + old.running)
        )
        return max(entered / span, 0.0)

    def service_seconds(self) -> float | None:
        new, old = self._history[-1], self._since(self.latency_window)
        total, count = new.service[0] - old.service[0], new.service[1] - old.service[1]
        if count <= 0:
            total, count = new.service
        return total / count if count > 0 else None

    def p90(self, which: str) -> float | None:
        new, old = self._history[-1], self._since(self.latency_window)
        if which == "ttft":
            return quantile(_diff(new.ttft, old.ttft), 0.9)
        return quantile(_diff(new.tpot, old.tpot), 0.9)
