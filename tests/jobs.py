"""Putting a raw job record in the queue, as the API would but with any bytes."""

from __future__ import annotations

from llmq.queue import Queue
from llmq.schema import Lifecycle


async def enqueue_raw(queue: Queue, rid: str, job: bytes) -> None:
    """Queue ``job`` (any bytes) for the ``mock`` model under ``rid``, with a record."""
    assert await queue.enqueue(
        rid,
        "mock",
        job=job,
        score=1,
        max_depth=100,
        cost=1,
        deadline_ms=2**50,
        record={"id": rid, "model": "mock", "status": "queued", "created_at": "1"},
        lifecycle=Lifecycle(event="queued", request_id=rid, model="mock", ts=0.0),
    )
