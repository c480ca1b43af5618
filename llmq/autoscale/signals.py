"""What the autoscaler reads from the cluster: queue, running set, registry, metric totals.

Nothing here is new state: the queue and running set are the model's own keys,
the workers are the registry, latencies and the service time are differences
between snapshots of the cluster-wide metric totals that every process flushes
(:mod:`llmq.metrics`). The arrival rate counts the ``queued`` entries of the
lifecycle streams (written at admission by ``record.lua``, stamped by Redis), read
incrementally from a cursor per stream: exact to the millisecond, where the metric totals lag
by their 1 s flush, which makes a 2 s rate from them swing by half.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from redis.asyncio import Redis

from llmq import metrics, registry
from llmq.protocol import keys
from llmq.protocol.queue import as_str
from llmq.schema import WorkerInfo

#: Most stream entries one read takes (the rest come with the next read).
_READ = 5000


@dataclass(frozen=True)
class Snapshot:
    at: float
    queued: int
    running: int
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
) -> tuple[tuple[float, float], dict[str, dict[float, float]]]:
    families: tuple[metrics.Family, ...] = (
        metrics.PREFILL_TIME,
        metrics.DECODE_TIME,
        metrics.TTFT,
        metrics.TPOT,
    )
    pipe = redis.pipeline(transaction=False)
    for family in families:
        pipe.hgetall(keys.metric(family.name))
    replies = await pipe.execute()
    service_sum = service_count = 0.0
    buckets: dict[str, dict[float, float]] = {metrics.TTFT.name: {}, metrics.TPOT.name: {}}
    for family, reply in zip(families, replies, strict=True):
        for raw, value in reply.items():
            parsed = metrics.parse_field(as_str(raw))
            if parsed is None or not parsed[1] or parsed[1][0] != model:
                continue
            kind = parsed[0]
            amount = float(value)
            if family in (metrics.PREFILL_TIME, metrics.DECODE_TIME):
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
    return (service_sum, service_count), buckets


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
        #: Redis times (ms) of this model's arrivals in the rate window, the cursor
        #: in each lifecycle stream, and the Redis time (ms) of the last read.
        self._arrivals: deque[int] = deque()
        self._cursors: dict[str, str] = {}
        self._now_ms = 0
        self._first_ms: int | None = None

    async def _read_arrivals(self) -> None:
        """Read what the lifecycle streams (one per request group) gained since the
        last read, in one pipeline per round: on a Redis Cluster it reaches every
        node that holds a group."""
        seconds, micros = await self.redis.time()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        if not self._cursors:
            self._cursors = dict.fromkeys(keys.LIFECYCLES, f"{now_ms}-0")
            self._first_ms = now_ms
        pending = list(self._cursors)
        while pending:
            pipe = self.redis.pipeline(transaction=False)
            for key in pending:
                pipe.xrange(key, min=f"({self._cursors[key]}", max="+", count=_READ)
            more = []
            for key, entries in zip(pending, await pipe.execute(), strict=True):
                for raw_id, fields in entries:
                    entry = {as_str(k): as_str(v) for k, v in fields.items()}
                    if entry.get("event") == "queued" and entry.get("model") == self.model:
                        self._arrivals.append(int(as_str(raw_id).split("-")[0]))
                if entries:
                    self._cursors[key] = as_str(entries[-1][0])
                if len(entries) == _READ:
                    more.append(key)
            pending = more
        self._arrivals = deque(sorted(self._arrivals))
        self._now_ms = now_ms
        keep_ms = int(max(self.rate_window, self.recent_window) * 1000)
        while self._arrivals and self._arrivals[0] <= now_ms - keep_ms:
            self._arrivals.popleft()

    async def snapshot(self) -> Snapshot:
        await self._read_arrivals()
        pipe = self.redis.pipeline(transaction=False)
        pipe.zcard(keys.queue(self.model))
        pipe.zcard(keys.running(self.model))
        queued, running = await pipe.execute()
        workers = await registry.live_workers(self.redis, self.worker_ttl)
        service, buckets = await _totals(self.redis, self.model)
        snap = Snapshot(
            at=time.monotonic(),
            queued=int(queued),
            running=int(running),
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

    def arrived(self, window: float) -> int:
        """This model's requests enqueued in the last ``window`` seconds (Redis time)."""
        since = self._now_ms - int(window * 1000)
        count = 0
        for t in reversed(self._arrivals):
            if t <= since:
                break
            count += 1
        return count

    def counted(self, window: float) -> tuple[int, float]:
        """Arrivals over the last ``window`` seconds and the seconds actually counted
        (less than ``window`` until the probe has read that long)."""
        span_ms = min(window * 1000, self._now_ms - (self._first_ms or self._now_ms))
        return self.arrived(window), span_ms / 1000

    def arrival_rate(self, window: float | None = None) -> float:
        """Requests per second that entered over ``window`` (default: the rate window;
        the law also reads the recent window, where a rise shows first)."""
        count, span = self.counted(window or self.rate_window)
        return count / span if span > 0 else 0.0

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
