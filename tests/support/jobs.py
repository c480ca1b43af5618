"""Putting a raw job record in the queue, as the API would but with any bytes."""

from __future__ import annotations

from enum import IntEnum

from llmq.protocol import keys
from llmq.protocol.queue import Claim, Enqueue, Queue
from llmq.schema import Lifecycle


class Placed(IntEnum):
    """Where admitting one request put it, as Redis shows it right after."""

    FULL = 0
    QUEUED = 1
    #: Claimed at once for a parked worker (running, never queued) and sent to it.
    HANDED_OFF = 2


def enqueue_call(rid: str, attach_to: str | None = None) -> Enqueue:
    """A request for ``mock`` with a bare record and job, as :meth:`Queue.admit` takes it."""
    return Enqueue(
        request_id=rid,
        model="mock",
        job=b"{}",
        score=1,
        cost=1,
        deadline_ms=2**50,
        record={"id": rid, "model": "mock", "status": "queued"},
        lifecycle=Lifecycle(event="queued", request_id=rid, model="mock", ts=0.0),
        attach_to=attach_to,
    )


async def enqueue_raw(queue: Queue, rid: str, job: bytes) -> None:
    """Queue ``job`` (any bytes) for the ``mock`` model under ``rid``, with a record."""
    assert await enqueue_costing(queue, rid, job=job)


async def enqueue_costing(
    queue: Queue,
    rid: str,
    cost: int = 1,
    score: int = 1,
    deadline_ms: int = 2**50,
    *,
    job: bytes | None = None,
    route: str = "",
    fair: str = "",
) -> Placed:
    """Queue (or hand off) a request for ``mock`` that costs ``cost`` tokens of budget,
    the way the API admits one (:meth:`Queue.admit`)."""
    call = Enqueue(
        request_id=rid,
        model="mock",
        job=job if job is not None else f'{{"job": "{rid}"}}'.encode(),
        score=score,
        cost=cost,
        deadline_ms=deadline_ms,
        record={"id": rid, "model": "mock", "status": "queued", "created_at": "1"},
        lifecycle=Lifecycle(event="queued", request_id=rid, model="mock", ts=0.0),
        route=route,
        fair=fair,
    )
    if not (await queue.admit([call], max_depth=100)).queued:
        return Placed.FULL
    if await queue.redis.zscore(keys.running("mock"), rid) is not None:
        return Placed.HANDED_OFF
    return Placed.QUEUED


async def claim_with(queue: Queue, *, budget_left: int | None, idle: bool) -> Claim:
    """One claim for ``mock`` by a worker that does not park (no worker id)."""
    return await queue.claim(
        "mock", lease_ms=3000, in_progress_ms=4000, budget_left=budget_left, idle=idle
    )
