"""What each tenant uses now and over the last hour: its requests at once, its tokens,
how often it was throttled.

Read from what the quota and the metrics keep already (the quota's requests at once,
tracked for tenants with limits; the cluster-wide totals of
``llmq_tenant_tokens_total`` and ``llmq_tenant_requests_total``, and the same counters
per minute, which every metrics flush adds to an hour-long window), when asked: by
``llmq tenant stats`` and the admin API, the same figures.
"""

from __future__ import annotations

import time
from typing import Any, cast

from pydantic import BaseModel
from redis.asyncio import Redis

from llmq import metrics
from llmq.metrics import field as metric_field
from llmq.metrics import minute_field
from llmq.protocol import keys
from llmq.tenants import text

#: The outcomes of ``llmq_tenant_requests_total``, in the order ``tenant stats`` shows them.
OUTCOMES = ("accepted", "rate_limited", "shed")
#: Minutes of history shown: the last hour, the current minute last.
HOUR_MINUTES = 60


class TenantUsage(BaseModel):
    name: str
    queued: int
    running: int
    tokens: int
    accepted: int
    rate_limited: int
    shed: int


async def tenant_usage(redis: Redis, name: str) -> TenantUsage:
    """One tenant's figures (its metrics totals lag by a flush, about a second)."""
    held = await cast("Any", redis.zrange(keys.quota_keys(name)[2], 0, -1))
    statuses = [await cast("Any", redis.hget(keys.request(text(rid)), "status")) for rid in held]
    queued = sum(1 for s in statuses if s and text(s) == "queued")
    running = sum(1 for s in statuses if s and text(s) == "running")
    totals = [
        await cast("Any", redis.hget(keys.metric(family.name), metric_field("", labels)))
        for family, labels in (
            (metrics.TENANT_TOKENS, (name,)),
            *((metrics.TENANT_REQUESTS, (name, o)) for o in OUTCOMES),
        )
    ]
    tokens, accepted, rate_limited, shed = (
        int(float(text(t))) if t is not None else 0 for t in totals
    )
    return TenantUsage(
        name=name,
        queued=queued,
        running=running,
        tokens=tokens,
        accepted=accepted,
        rate_limited=rate_limited,
        shed=shed,
    )


class LastHour(BaseModel):
    """One tenant's counts per minute, oldest first; the last minute is the current one,
    still counting (a flush lags by about a second)."""

    #: Unix time of the first minute's start.
    start: int
    tokens: list[int]
    accepted: list[int]
    rate_limited: list[int]
    shed: list[int]


async def last_hour(
    redis: Redis, names: list[str], now: float | None = None
) -> dict[str, LastHour]:
    """Each named tenant's usage per minute over the last hour, in one round trip."""
    current = int(time.time() if now is None else now) // 60
    first = current - HOUR_MINUTES + 1
    pipe = redis.pipeline(transaction=False)
    for minute in range(first, current + 1):
        pipe.hgetall(keys.metrics_minute(minute))
    series = {n: {k: [0] * HOUR_MINUTES for k in ("tokens", *OUTCOMES)} for n in names}
    wanted = {minute_field(metrics.TENANT_TOKENS.name, (n,)): (n, "tokens") for n in names}
    for n in names:
        for o in OUTCOMES:
            wanted[minute_field(metrics.TENANT_REQUESTS.name, (n, o))] = (n, o)
    for i, reply in enumerate(await pipe.execute()):
        for raw, value in reply.items():
            where = wanted.get(text(raw))
            if where is not None:
                series[where[0]][where[1]][i] = int(float(text(value)))
    return {n: LastHour(start=first * 60, **counts) for n, counts in series.items()}
