"""How deep a model's queue is, read at scrape time for the ``/metrics`` endpoint.

Read-only: nothing here changes the queue, and nothing on the request path keeps
these figures; the scraper pays for them when it asks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

from redis.asyncio import Redis

from llmq.protocol import keys
from llmq.protocol.arq_job import deserialize
from llmq.protocol.codec import as_str


async def queue_depth(redis: Redis, model: str) -> int:
    return cast(int, await redis.zcard(keys.queue(model)))


async def queued_by_priority(redis: Redis, model: str, limit: int = 10_000) -> dict[int, int]:
    """How many of the model's queued requests have each priority (first ``limit``).

    Read from the job payloads at scrape time, so the hot path keeps no extra state.
    """
    return (await queued_by(redis, model, limit)).priority


@dataclass(frozen=True)
class Breakdown:
    """A model's queued requests counted by priority, by tenant; and the batch lines."""

    priority: dict[int, int] = field(default_factory=dict)
    tenant: dict[str, int] = field(default_factory=dict)
    batch: int = 0
    #: How many were counted: at most the ``limit`` read.
    counted: int = 0


async def queued_by(redis: Redis, model: str, limit: int = 10_000) -> Breakdown:
    """The first ``limit`` queued requests of ``model`` counted by priority, by tenant
    (``-``: none), and how many are batch lines, from their job payloads."""
    ids = await redis.zrange(keys.queue(model), 0, limit - 1)
    out = Breakdown()
    if not ids:
        return out
    counted = batch = 0
    for raw in await redis.mget([keys.job(as_str(i), model) for i in ids]):
        try:
            payload = deserialize(raw)["k"]["payload"]
            priority = int(payload["priority"])
        except (TypeError, ValueError, KeyError):
            continue  # gone meanwhile, or not an llmq job
        counted += 1
        batch += bool(payload.get("batch"))
        tenant = str(payload.get("tenant") or "-")
        out.tenant[tenant] = out.tenant.get(tenant, 0) + 1
        out.priority[priority] = out.priority.get(priority, 0) + 1
    return Breakdown(out.priority, out.tenant, batch, counted)
