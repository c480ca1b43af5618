"""What each tenant uses now: its requests at once, its tokens, how often it was throttled.

Read from what the quota and the metrics keep already (the quota's requests at once,
tracked for tenants with limits; the cluster-wide totals of
``llmq_tenant_tokens_total`` and ``llmq_tenant_requests_total``), when asked: by
``llmq tenant stats`` and the admin API, the same figures.
"""

from __future__ import annotations

from typing import Any, cast

from pydantic import BaseModel
from redis.asyncio import Redis

from llmq import metrics
from llmq.metrics import field as metric_field
from llmq.protocol import keys
from llmq.tenants import text

#: The outcomes of ``llmq_tenant_requests_total``, in the order ``tenant stats`` shows them.
OUTCOMES = ("accepted", "rate_limited", "shed")


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
