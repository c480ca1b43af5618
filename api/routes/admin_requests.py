"""The admin API's requests: every tenant's, listed and filtered; one opened; cancelled.

A listing never holds a prompt; one request opened (``GET /admin/requests/{id}``)
does, while its job is kept (queued or running): the operator asked for that one.
Its tokens stream from ``/admin/requests/{id}/events``, the native event stream
(:mod:`api.routes.native`) read without its owner's key.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query

from api import request_list
from api.admin import REFUSALS, AdminCaller, audit
from api.errors import InvalidRequest
from api.openapi import EVENT_STREAM, error_responses
from api.pool_view import models as pool_models
from api.routes import native
from api.routes.native import _events, _record
from api.state import AppState, State
from api.streams import event_stream
from api.streams.subscription import valid_id
from llmq.admin import admin_key
from llmq.protocol import keys
from llmq.protocol.arq_job import deserialize
from llmq.schema import TERMINAL_STATUSES, Status
from llmq.tenants import NAME_PATTERN

router = APIRouter(prefix="/admin", tags=["admin"])

#: How often a stream checks that its reader's admin key still holds.
REVOKED_POLL_SECONDS = 1.0

RequestId = Annotated[str, Path(min_length=1, max_length=64)]


@router.get("/requests", responses=error_responses(*REFUSALS, 400))
async def list_requests(
    state: State,
    _: AdminCaller,
    model: Annotated[str | None, Query(min_length=1, max_length=128)] = None,
    tenant: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None,
    status: Status | None = None,
    limit: Annotated[int, Query(ge=1, le=request_list.PAGE_MAX)] = 50,
) -> dict[str, Any]:
    """Queued requests first (in the order they will be claimed), then running, then
    the newest ended; no prompts. ``matched``: how many of the ids looked at (at most
    1,000) matched; ``complete``: false when there were more to look at."""
    models = await pool_models(state)
    if model is not None:
        if model not in models:
            raise InvalidRequest(
                f"no model '{model}' in the pool", param="model", code="invalid_value"
            )
        models = [model]
    page = await request_list.listed(state, models, tenant=tenant, status=status, limit=limit)
    return {
        "object": "list",
        "data": [request_list.summary(r) for r in page.records],
        "has_more": page.matched > len(page.records),
        "matched": page.matched,
        "complete": page.complete,
    }


async def _prompt(state: AppState, model: str, request_id: str) -> str | None:
    """The request's prompt while its job is kept (queued or running), else None."""
    raw = await state.redis.get(keys.job(request_id, model))
    try:
        return str(deserialize(raw)["k"]["payload"]["prompt"])
    except (TypeError, ValueError, KeyError):
        return None


@router.get("/requests/{request_id}", responses=error_responses(*REFUSALS, 404))
async def one_request(request_id: RequestId, state: State, _: AdminCaller) -> dict[str, Any]:
    """One request: its record, its place in the queue while queued, its prompt, and
    its lifecycle (each state change, each attempt)."""
    record = await _record(state, request_id, None)
    body = {"object": "request", **request_list.summary(record)}
    if record.status == "queued":
        body["position"] = await state.redis.zrank(keys.queue(record.model), request_id)
    body["prompt"] = await _prompt(state, record.model, request_id)
    body["lifecycle"] = await request_list.lifecycle(state, request_id)
    return body


@router.post("/requests/{request_id}/cancel", responses=error_responses(*REFUSALS, 404))
async def cancel_request(request_id: RequestId, state: State, who: AdminCaller) -> dict[str, Any]:
    """Cancel, as its owner's ``DELETE /v1/requests/{id}`` would: a queued request never
    runs; a running one stops within a token interval; an ended one stays as it is."""
    record = await _record(state, request_id, None)
    changed = record.status not in TERMINAL_STATUSES
    reply = await native.cancel_request(state, record)
    await audit(
        state,
        who,
        "request.cancel",
        request_id,
        model=record.model,
        tenant=record.tenant,
        changed=changed,
    )
    return reply


@router.get(
    "/requests/{request_id}/events",
    response_model=None,
    responses={200: EVENT_STREAM, **error_responses(*REFUSALS, 400, 404)},
)
async def request_events(
    request_id: RequestId,
    state: State,
    who: AdminCaller,
    last_event_id: Annotated[str | None, Header()] = None,
) -> event_stream.EventStream:
    """The request's events as ``GET /v1/requests/{id}/events`` sends them."""
    resume = last_event_id or "0-0"
    if not valid_id(resume):
        raise InvalidRequest(
            "Last-Event-ID must be a stream id", param="Last-Event-ID", code="invalid_value"
        )
    record = await _record(state, request_id, None)
    return event_stream.EventStream(
        _events(state, record, resume), until=_revoked(state, who.digest)
    )


async def _revoked(state: AppState, key_digest: str) -> None:
    """Return once the reader's admin key is revoked: its stream ends then."""
    while await admin_key(state.redis, key_digest) is not None:
        await asyncio.sleep(REVOKED_POLL_SECONDS)
