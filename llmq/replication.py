"""Acknowledged enqueues: wait until a replica holds what the primary just wrote.

Redis replicates asynchronously, so a primary that dies right after answering
can take the last writes with it, and a failover then loses requests that the
API has already acknowledged. ``WAIT n timeout`` blocks until ``n`` replicas have
acknowledged every write made *on the same connection*; the enqueue script ran on
some pooled connection, so this writes once more (re-setting the request record's
TTL to its full value, a no-op in effect) and waits on that connection, in one
pipeline. Replicas apply the replication stream in order, so once they hold this
later write they hold the enqueue too. It bounds loss; it does not remove it (a
replica that acknowledged can still lose the failover election to one that did
not, if there are several).
"""

from __future__ import annotations

from redis.asyncio import Redis

from llmq.protocol import keys


async def acknowledged(
    redis: Redis, request_id: str, *, ttl_seconds: int, replicas: int, timeout_ms: int
) -> bool:
    """True once ``replicas`` replicas hold the request's enqueue (false after ``timeout_ms``)."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.expire(keys.request(request_id), ttl_seconds)
        pipe.execute_command("WAIT", replicas, timeout_ms)
        _, acked = await pipe.execute()
    return int(acked) >= replicas
