"""Putting a raw job record in the queue, as the API would but with any bytes."""

from __future__ import annotations

from llmq.protocol.queue import Admission, Claim, Queue
from llmq.schema import Lifecycle


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
) -> Admission:
    """Queue (or hand off) a request for ``mock`` that costs ``cost`` tokens of budget."""
    return await queue.enqueue(
        rid,
        "mock",
        job=job if job is not None else f'{{"job": "{rid}"}}'.encode(),
        score=score,
        max_depth=100,
        cost=cost,
        deadline_ms=deadline_ms,
        record={"id": rid, "model": "mock", "status": "queued", "created_at": "1"},
        lifecycle=Lifecycle(event="queued", request_id=rid, model="mock", ts=0.0),
        route=route,
    )


async def claim_with(queue: Queue, *, budget_left: int | None, idle: bool) -> Claim:
    """One claim for ``mock`` by a worker that does not park (no worker id)."""
    return await queue.claim(
        "mock", lease_ms=3000, in_progress_ms=4000, budget_left=budget_left, idle=idle
    )
