"""OpenAI's Batch API (``client.batches``): create, retrieve, list, cancel.

A batch is validated whole when it is created (:mod:`api.batch.batch_lines`) and stored
with its lines (:mod:`api.batch.batch_store`); the feeder of one API process runs it on the
pool's idle capacity (:mod:`api.batch.batch_feeder`).
"""

from __future__ import annotations

import re
import time
from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from api.admission.auth import Admitted, Caller
from api.batch import batch_lines, batch_store, files
from api.errors import InvalidRequest
from api.openapi import error_responses
from api.routes.files import list_page
from api.state import State

router = APIRouter(tags=["batch"])

#: The longest completion window accepted (OpenAI's is 24h; llmq accepts s, m, h up to this).
MAX_WINDOW_SECONDS = 7 * 86_400
_WINDOW = re.compile(r"^([1-9][0-9]{0,6})([smh])$")


class CreateBatch(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    input_file_id: str = Field(min_length=1, max_length=128)
    endpoint: str
    completion_window: str = "24h"
    metadata: dict[str, str] | None = Field(None, max_length=16)


def window_seconds(window: str) -> int:
    found = _WINDOW.match(window)
    seconds = 0 if found is None else int(found[1]) * {"s": 1, "m": 60, "h": 3600}[found[2]]
    if not 0 < seconds <= MAX_WINDOW_SECONDS:
        raise InvalidRequest(
            f"completion_window must be like '24h' (seconds 's', minutes 'm' or hours 'h', "
            f"at most {MAX_WINDOW_SECONDS // 3600}h), got {window!r}",
            param="completion_window",
            code="invalid_value",
        )
    return seconds


@router.post("/v1/batches", responses=error_responses(400, 401, 404))
async def create_batch(body: CreateBatch, state: State, admission: Admitted) -> dict[str, Any]:
    if body.endpoint not in batch_lines.ENDPOINTS:
        raise InvalidRequest(
            f"endpoint must be one of {', '.join(batch_lines.ENDPOINTS)}, got {body.endpoint!r}",
            param="endpoint",
            code="invalid_value",
        )
    owner = admission.owner
    seconds = window_seconds(body.completion_window)
    meta = await files.find(state.redis, body.input_file_id, owner)
    if meta.purpose != "batch":
        raise InvalidRequest(
            f"the file '{meta.id}' is not a batch input file (purpose {meta.purpose!r})",
            param="input_file_id",
            code="invalid_value",
        )
    text = await files.content(state.redis, body.input_file_id, owner)
    pool = state.policy.pool()  # the batch's model is known only once parsed
    parsed = batch_lines.parse(text, body.endpoint, pool.batch_max_lines)
    batch = batch_store.new_batch(
        endpoint=body.endpoint,
        input_file_id=body.input_file_id,
        completion_window=body.completion_window,
        window_seconds=seconds,
        metadata=body.metadata,
        owner=owner,
        tenant=None if (tenant := admission.tenant) is None else tenant.name,
    )
    now = int(time.time())
    if parsed.errors:
        errors = {"object": "list", "data": [e.model_dump() for e in parsed.errors]}
        batch = batch.model_copy(update={"status": "failed", "failed_at": now, "errors": errors})
    else:
        counts = {"total": len(parsed.lines), "completed": 0, "failed": 0}
        batch = batch.model_copy(
            update={
                "status": "in_progress",
                "in_progress_at": now,
                "model": parsed.model,
                "request_counts": counts,
            }
        )
    await batch_store.create(state.redis, batch, parsed.lines, pool.batch_ttl_seconds)
    return batch.public()


@router.get("/v1/batches", responses=error_responses(401))
async def list_batches(
    state: State,
    owner: Caller,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> dict[str, Any]:
    found, more = await batch_store.listed(state.redis, owner, after=after, limit=limit)
    return list_page([b.public() for b in found], more)


@router.get("/v1/batches/{batch_id}", responses=error_responses(401, 404))
async def retrieve_batch(batch_id: str, state: State, owner: Caller) -> dict[str, Any]:
    return (await batch_store.find(state.redis, batch_id, owner)).public()


@router.post("/v1/batches/{batch_id}/cancel", responses=error_responses(401, 404))
async def cancel_batch(batch_id: str, state: State, owner: Caller) -> dict[str, Any]:
    """Stop feeding the batch and cancel its lines in flight; it ends ``cancelled`` with
    the output of the lines that finished (an ended batch is answered as it is)."""
    await batch_store.find(state.redis, batch_id, owner)
    await batch_store.move(state.redis, batch_id, "cancelling", since=("validating", "in_progress"))
    return (await batch_store.find(state.redis, batch_id, owner)).public()
