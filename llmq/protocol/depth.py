"""How deep a model's queue is, read at scrape time for the ``/metrics`` endpoint.

Read-only: nothing here changes the queue, and nothing on the request path keeps
these figures; the scraper pays for them when it asks.
"""

from __future__ import annotations

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
    ids = await redis.zrange(keys.queue(model), 0, limit - 1)
    if not ids:
        return {}
    counts: dict[int, int] = {}
    for raw in await redis.mget([keys.job(as_str(i), model) for i in ids]):
        try:
            priority = int(deserialize(raw)["k"]["payload"]["priority"])
        except (TypeError, ValueError, KeyError):
            continue  # gone meanwhile, or not an llmq job
        counts[priority] = counts.get(priority, 0) + 1
    return counts
