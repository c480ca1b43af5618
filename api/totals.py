"""The cluster-wide metric totals, read back from Redis (written by :mod:`llmq.metrics`).

One ``HGETALL`` per family, in one pipeline: the hashes are small (label sets x
bucket bounds), so a scrape costs one round trip whatever the traffic was.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from redis.asyncio import Redis

from llmq import metrics
from llmq.protocol import keys
from llmq.protocol.queue import as_str


@dataclass
class HistogramTotals:
    """One label set's histogram: per-bucket (not cumulative) counts, sum and count."""

    buckets: dict[float, float] = field(default_factory=dict)
    sum: float = 0.0
    count: float = 0.0

    def cumulative(self, bounds: tuple[float, ...]) -> list[tuple[float, float]]:
        """``(upper bound, cumulative count)`` for ``bounds`` and +Inf, in order."""
        out, running = [], 0.0
        for bound in (*bounds, math.inf):
            running += self.buckets.get(bound, 0.0)
            out.append((bound, running))
        return out

    def merge(self, other: HistogramTotals) -> None:
        for bound, n in other.buckets.items():
            self.buckets[bound] = self.buckets.get(bound, 0.0) + n
        self.sum += other.sum
        self.count += other.count


@dataclass
class Totals:
    histograms: dict[str, dict[tuple[str, ...], HistogramTotals]]
    counters: dict[str, dict[tuple[str, ...], float]]

    def models(self) -> set[str]:
        """Every model named in a label set (the first label is always ``model``)."""
        named = {labels[0] for series in self.histograms.values() for labels in series}
        named |= {labels[0] for series in self.counters.values() for labels in series}
        return {m for m in named if m}

    def histogram(self, family: metrics.Histogram) -> HistogramTotals:
        """The family's histogram summed over every label set."""
        merged = HistogramTotals()
        for part in self.histograms.get(family.name, {}).values():
            merged.merge(part)
        return merged


def _bound(kind: str) -> float | None:
    try:
        return float(kind)  # "+Inf" parses to inf
    except ValueError:
        return None


async def read_totals(redis: Redis) -> Totals:
    pipe = redis.pipeline(transaction=False)
    for family in metrics.FAMILIES.values():
        pipe.hgetall(keys.metric(family.name))
    replies = await pipe.execute()
    histograms: dict[str, dict[tuple[str, ...], HistogramTotals]] = {}
    counters: dict[str, dict[tuple[str, ...], float]] = {}
    for family, reply in zip(metrics.FAMILIES.values(), replies, strict=True):
        if isinstance(family, metrics.Counter):
            series: dict[tuple[str, ...], float] = {}
            for raw, value in reply.items():
                parsed = metrics.parse_field(as_str(raw))
                if parsed is not None and parsed[0] == "" and len(parsed[1]) == len(family.labels):
                    series[parsed[1]] = float(as_str(value))
            counters[family.name] = series
            continue
        hists: defaultdict[tuple[str, ...], HistogramTotals] = defaultdict(HistogramTotals)
        for raw, value in reply.items():
            parsed = metrics.parse_field(as_str(raw))
            if parsed is None or len(parsed[1]) != len(family.labels):
                continue
            kind, labels = parsed
            number = float(as_str(value))
            if kind == "sum":
                hists[labels].sum = number
            elif kind == "count":
                hists[labels].count = number
            elif (bound := _bound(kind)) is not None:
                hists[labels].buckets[bound] = number
        histograms[family.name] = dict(hists)
    return Totals(histograms, counters)
