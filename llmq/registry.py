"""The process registry: which workers and API processes are alive.

Workers: who is alive, what model it serves, how busy it is.

Each worker writes its :class:`~llmq.schema.WorkerInfo` under its own key with a
short TTL and bumps its score in the ``llmq.protocol.keys.WORKERS`` sorted set at every
heartbeat. A worker that stops heartbeating drops out within ``worker_ttl``
seconds, whether it exited cleanly or was killed. Both the heartbeat and the
liveness check use lease time (``llmq/protocol/lua/clock.lua``), so a stall or restart of
Redis does not make every worker look dead (and the API answer 503) afterwards.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable
from typing import Any, cast

from pydantic import ValidationError
from redis.asyncio import Redis

from llmq.protocol import keys
from llmq.protocol.scripts import scripts_for
from llmq.protocol.slots import WorkerBeat
from llmq.schema import WorkerInfo

log = logging.getLogger(__name__)


async def heartbeat(redis: Redis, info: WorkerInfo, ttl_seconds: float) -> None:
    await WorkerBeat(
        workers_key=keys.WORKERS,
        info_key=keys.worker(info.id),
        clock_key=keys.CLOCK,
        worker_id=info.id,
        info=info.model_dump_json(),
        ttl_ms=int(ttl_seconds * 1000),
        info_prefix=keys.worker(""),
    ).run(scripts_for(redis))


async def unregister(redis: Redis, worker_id: str) -> None:
    pipe = redis.pipeline(transaction=True)
    pipe.delete(keys.worker(worker_id))
    pipe.zrem(keys.WORKERS, worker_id)
    await pipe.execute()


async def live_workers(redis: Redis, ttl_seconds: float) -> list[WorkerInfo]:
    """Workers whose heartbeat is younger than ``ttl_seconds`` of lease time, sorted by id."""
    lease = await cast("Awaitable[Any]", redis.hget(keys.CLOCK, "lease"))
    now_ms = int(lease) if lease is not None else int(time.time() * 1000)
    since = now_ms - int(ttl_seconds * 1000)
    ids = await redis.zrangebyscore(keys.WORKERS, since, "+inf")
    if not ids:
        return []
    raw = await redis.mget([keys.worker(i if isinstance(i, str) else i.decode()) for i in ids])
    workers: list[WorkerInfo] = []
    for value in raw:
        if value is None:
            continue
        try:
            workers.append(WorkerInfo.model_validate_json(value))
        except ValidationError:
            log.warning("skipping malformed worker entry %r", value[:200])
    return sorted(workers, key=lambda w: w.id)


#: How long an operator's drain of a worker holds: longer than any worker's drain, and
#: bounded, since a worker id is never reused.
DRAIN_TTL_SECONDS = 86_400


async def drain(redis: Redis, worker_id: str) -> None:
    """Tell the worker to claim nothing more; it sees this at its next heartbeat."""
    await redis.set(keys.drain(worker_id), "1", ex=DRAIN_TTL_SECONDS)


async def drained(redis: Redis, worker_id: str) -> bool:
    """Whether an operator drained the worker."""
    return bool(await redis.exists(keys.drain(worker_id)))
