"""``/v1/metrics/summary``: the cluster's figures as plain JSON, for humans and scripts.

Percentiles are *estimated* from the histogram buckets, the way Prometheus'
``histogram_quantile`` does it: the rank is located in its bucket and the value
interpolated linearly inside it, so they are only as precise as the buckets
(:mod:`llmq.metrics`); a rank in the +Inf bucket yields the highest finite bound.
Rates are counter deltas over the last ``WINDOW_SECONDS`` seconds (the current one
included, so the freshest flush counts at once), read
from the per-second hashes that every flush adds to (they expire after two minutes).
"""

from __future__ import annotations

import math
import time
from typing import Any

from redis.asyncio import Redis

from api.totals import HistogramTotals, Totals
from llmq import metrics
from llmq.protocol import keys
from llmq.protocol.queue import as_str

WINDOW_SECONDS = 60
QUANTILES = (0.5, 0.95, 0.99)


def estimate_quantile(q: float, cumulative: list[tuple[float, float]]) -> float | None:
    """The ``q``-quantile from ``(upper bound, cumulative count)`` pairs ending with +Inf.

    None when there is no observation. The first bucket's lower bound is taken as 0.
    """
    if not cumulative or cumulative[-1][1] <= 0:
        return None
    total = cumulative[-1][1]
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, count in cumulative:
        if count >= rank and count > below:
            if math.isinf(bound):
                return lower  # the highest finite bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        if not math.isinf(bound):
            lower = bound
        below = count
    return lower


def estimated_percentiles(
    series: HistogramTotals, family: metrics.Histogram
) -> dict[str, float | None]:
    """``p50``, ``p95``, ``p99`` of one histogram series, estimated from its buckets."""
    cumulative = series.cumulative(family.buckets)
    return {f"p{round(q * 100)}": estimate_quantile(q, cumulative) for q in QUANTILES}


async def window_rates(redis: Redis, now: float | None = None) -> dict[str, float]:
    """Per-second averages of each counter over the last ``WINDOW_SECONDS`` seconds."""
    current = int(time.time() if now is None else now)
    pipe = redis.pipeline(transaction=False)
    for second in range(current - WINDOW_SECONDS + 1, current + 1):
        pipe.hgetall(keys.metrics_second(second))
    sums = {c.name: 0.0 for c in metrics.COUNTERS}
    for reply in await pipe.execute():
        for name, value in reply.items():
            name = as_str(name)
            if name in sums:
                sums[name] += float(as_str(value))
    return {name: total / WINDOW_SECONDS for name, total in sums.items()}


def cluster_summary(totals: Totals, rates: dict[str, float]) -> dict[str, Any]:
    """The body of ``/v1/metrics/summary``: outcomes, latency percentiles, rates."""
    outcomes = dict.fromkeys(metrics.OUTCOMES, 0)
    for (_, reason), n in totals.counters.get(metrics.REQUESTS.name, {}).items():
        outcomes[reason] = outcomes.get(reason, 0) + round(n)
    latency = {
        label: estimated_percentiles(totals.histogram(family), family)
        for label, family in (
            ("time_to_first_token_seconds", metrics.TTFT),
            ("inter_token_latency_seconds", metrics.ITL),
            ("e2e_request_latency_seconds", metrics.E2E),
        )
    }
    return {
        "requests": {"total": sum(outcomes.values()), "by_outcome": outcomes},
        "latency": latency,
        "window_seconds": WINDOW_SECONDS,
        "requests_per_second": rates.get(metrics.REQUESTS.name, 0.0),
        "tokens_per_second": rates.get(metrics.GENERATION_TOKENS.name, 0.0),
        "prompt_tokens_per_second": rates.get(metrics.PROMPT_TOKENS.name, 0.0),
    }
