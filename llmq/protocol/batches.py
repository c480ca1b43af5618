"""The Batch API's steps in Redis: take lines to feed, record a line's result exactly
once, move a batch's status, hold the feeder's lease, and how much room a model's pool
has for batch lines.

Each step is one script (``lua/batch_take.lua``, ``batch_result.lua``,
``batch_status.lua``) over the keys of one batch (:func:`llmq.protocol.keys.batch`
and its neighbours, one hash tag), or over the feeder's lease (``batch_lease.lua``);
the API's feeder (``api/batch/batch_feeder.py``) and batch routes call them.
"""

from __future__ import annotations

import time
from typing import Any

from redis.asyncio import Redis

from llmq.protocol import keys
from llmq.protocol.codec import as_str
from llmq.protocol.queue import BATCH_BAND_MS
from llmq.protocol.scripts import scripts_for
from llmq.protocol.slots import BatchLease, BatchResult, BatchStatus, BatchTake


async def take(redis: Redis, batch_id: str, count: int) -> list[str]:
    """The next ``count`` lines of an in-progress batch, now running (JSON each)."""
    taken = await BatchTake(
        keys.batch(batch_id), keys.batch_lines(batch_id), keys.batch_running(batch_id), count
    ).run(scripts_for(redis))
    return [as_str(line) for line in taken]


async def record(redis: Redis, batch_id: str, custom_id: str, line: str, *, ok: bool) -> bool:
    """Record a line's result unless it has one; True if this call recorded it."""
    recorded = await BatchResult(
        keys.batch(batch_id),
        keys.batch_running(batch_id),
        keys.batch_output(batch_id),
        keys.batch_errors(batch_id),
        custom_id,
        line,
        "1" if ok else "0",
    ).run(scripts_for(redis))
    return bool(recorded)


async def lease(redis: Redis, holder: str, ms: int) -> bool:
    """Take or keep the feeder's lease for ``ms`` (True while ``holder`` holds it), or,
    with ``ms`` 0, give it up if ``holder`` holds it (True if it did)."""
    held = await BatchLease(keys.BATCH_FEEDER, holder, ms).run(scripts_for(redis))
    return bool(held)


async def move(redis: Redis, batch_id: str, status: str, *, since: tuple[str, ...]) -> bool:
    """Move the batch to ``status`` if it is in one of ``since``; True if it moved."""
    moved = await BatchStatus(keys.batch(batch_id), status, int(time.time()), since).run(
        scripts_for(redis)
    )
    return bool(moved)


async def room(redis: Redis, model: str, lookahead: int) -> int:
    """How many batch lines ``model``'s pool can take now: none while an interactive
    request waits; else its parked workers' free slots, plus ``lookahead`` less the
    batch lines already waiting in the batch band."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.hvals(keys.parked_terms(model))
        pipe.zcount(keys.queue(model), "-inf", f"({BATCH_BAND_MS}")
        pipe.zcount(keys.queue(model), BATCH_BAND_MS, "+inf")
        terms, live_waiting, batch_waiting = await pipe.execute()
    if live_waiting:
        return 0
    free = 0
    for term in terms:
        head: Any = as_str(term).split("|", 1)[0]
        free += int(head) if head.isdigit() else 0
    return max(0, free + lookahead - int(batch_waiting))


#: How long a worker's claim to give a slot to one live request holds: until that
#: request is claimed by the slot freed for it.
YIELD_CLAIM_MS = 2000


async def yield_for(redis: Redis, model: str, worker_id: str, most: int) -> int:
    """How many of its batch lines a full worker should hand back now: one per live
    request waiting in ``model``'s queue that no other worker yields for already
    (``SET NX`` of :func:`keys.batch_yield`), at most ``most``."""
    if most <= 0:
        return 0
    live = await redis.zrangebyscore(
        keys.queue(model), "-inf", f"({BATCH_BAND_MS}", start=0, num=most
    )
    won = 0
    for rid in live:
        claimed = await redis.set(
            keys.batch_yield(as_str(rid), model), worker_id, nx=True, px=YIELD_CLAIM_MS
        )
        won += 1 if claimed else 0
    return won


async def note_yield(redis: Redis, request_id: str) -> None:
    """Count a batch line's yield in its record: a yield is a run, not a failure."""
    await redis.hincrby(keys.request(request_id), "yields", 1)  # type: ignore[misc]


async def yields(redis: Redis, request_id: str) -> int:
    raw = await redis.hget(keys.request(request_id), "yields")  # type: ignore[misc]
    return 0 if raw is None else int(raw)
