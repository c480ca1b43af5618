"""The admin API's batches: every tenant's, newest first, with their progress; cancel one.

Batches are indexed per owner (``keys.batches_of``); the listing reads at most
:data:`INDEXES_MAX` owners' indexes (found by ``SCAN``) and loads only the newest
``limit`` batches of them all. A cancel is the owner's cancel
(``POST /v1/batches/{id}/cancel``) without the owner's key.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query
from fastapi.responses import PlainTextResponse

from api.admin import REFUSALS, AdminCaller, audit
from api.batch import batch_store, files
from api.errors import NotFound
from api.openapi import error_responses
from api.state import AppState, State
from llmq.protocol import keys
from llmq.tenants import text

router = APIRouter(prefix="/admin", tags=["admin"])

#: The most owners' batch indexes one listing reads.
INDEXES_MAX = 200
PAGE_MAX = 100

BatchId = Annotated[str, Path(min_length=1, max_length=128)]


def _rate(batch: batch_store.BatchObject, now: float) -> float | None:
    """Lines ended (completed or failed) per minute since the batch started, up to its
    end or now; ``None`` before it started or within its first second."""
    if batch.in_progress_at is None:
        return None
    ended = [batch.finalizing_at, batch.cancelling_at, batch.expired_at, batch.failed_at]
    until = min([t for t in ended if t is not None], default=now)
    seconds = until - batch.in_progress_at
    counts = batch.request_counts
    done = counts.get("completed", 0) + counts.get("failed", 0)
    return round(done * 60 / seconds, 1) if seconds >= 1 else None


def _row(batch: batch_store.BatchObject) -> dict[str, Any]:
    return {
        **batch.public(),
        "tenant": batch.tenant,
        "model": batch.model,
        "lines_per_minute": _rate(batch, time.time()),
    }


async def _newest(state: AppState, limit: int) -> list[str]:
    found: dict[str, float] = {}
    indexes = [keys.BATCHES_ACTIVE]
    async for index in state.redis.scan_iter(match=keys.batches_of("*"), count=100):
        indexes.append(text(index))
        if len(indexes) > INDEXES_MAX:
            break
    for index in indexes:
        for batch_id, created in await state.redis.zrevrange(index, 0, limit - 1, withscores=True):
            found[text(batch_id)] = float(created)
    return sorted(found, key=lambda b: -found[b])[:limit]


@router.get("/batches", responses=error_responses(*REFUSALS, 400))
async def list_batches(
    state: State,
    _: AdminCaller,
    limit: Annotated[int, Query(ge=1, le=PAGE_MAX)] = 20,
) -> dict[str, Any]:
    """Every tenant's batches, newest first: status, lines done and failed, their rate
    (lines ended per minute since the batch started), tenant."""
    rows = []
    for batch_id in await _newest(state, limit):
        batch = await batch_store.load(state.redis, batch_id)
        if batch is not None:
            rows.append(_row(batch))
    return {"object": "list", "data": rows}


@router.post("/batches/{batch_id}/cancel", responses=error_responses(*REFUSALS, 404))
async def cancel_batch(batch_id: BatchId, state: State, who: AdminCaller) -> dict[str, Any]:
    """Stop feeding the batch and cancel its lines in flight (an ended one stays as it is)."""
    if await batch_store.load(state.redis, batch_id) is None:
        raise NotFound(f"no batch with id '{batch_id}'", param="batch_id", code="batch_not_found")
    moved = await batch_store.move(
        state.redis, batch_id, "cancelling", since=("validating", "in_progress")
    )
    await audit(state, who, "batch.cancel", batch_id, changed=moved)
    found = await batch_store.load(state.redis, batch_id)
    return _row(found) if found is not None else {"id": batch_id, "object": "batch"}


@router.get(
    "/batches/{batch_id}/{part}",
    response_class=PlainTextResponse,
    responses={
        200: {"content": {"application/jsonl": {"schema": {"type": "string"}}}},
        **error_responses(*REFUSALS, 404),
    },
)
async def batch_file(
    batch_id: BatchId, part: Literal["output", "errors"], state: State, who: AdminCaller
) -> PlainTextResponse:
    """The batch's output file (the lines that succeeded) or its error file (the lines
    that failed, and why), once made: as its owner downloads them. A tenant's data:
    each download is written to the audit trail."""
    batch = await batch_store.load(state.redis, batch_id)
    file_id = None
    if batch is not None:
        file_id = batch.output_file_id if part == "output" else batch.error_file_id
    if batch is None or file_id is None:
        raise NotFound(
            f"no {part} file of batch '{batch_id}' (yet)", param="batch_id", code="file_not_found"
        )
    content = await files.content(state.redis, file_id, batch.owner)
    await audit(state, who, f"batch.{part}", batch_id, file=file_id)
    return PlainTextResponse(
        content,
        media_type="application/jsonl",
        headers={"Content-Disposition": f'attachment; filename="{batch_id}-{part}.jsonl"'},
    )
