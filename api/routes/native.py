"""The native API: submit now, follow later, resume after a reconnect.

``GET /v1/requests/{id}/events`` is SSE whose event ids are the Redis stream
ids; a client that reconnects with ``Last-Event-ID`` (or ``?last_event_id=``)
gets exactly the events after the last one it saw.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from api.admission.auth import REVOKED_CODE, REVOKED_MESSAGE, Admitted, Caller, admitted, revoked
from api.admission.submit import submit
from api.bodies import NativeRequest
from api.cancel import cancel
from api.direct_route import DirectRoute, SessionHeader
from api.errors import InvalidRequest, NotFound
from api.openapi import EVENT_STREAM, error_responses
from api.state import AppState, State
from api.streams import event_stream
from api.streams.follow import IDLE, follow
from api.streams.subscription import valid_id
from api.timing import RelayTimer
from llmq.protocol import keys
from llmq.schema import (
    TERMINAL_STATUSES,
    ErrorEvent,
    RequestRecord,
    TokensEvent,
    is_terminal,
)

log = logging.getLogger(__name__)

router = APIRouter(tags=["native"])
#: The generating route, on its first token's path (:mod:`api.direct_route`).
generation = APIRouter(tags=["native"], route_class=DirectRoute)

RequestId = Annotated[str, Path(min_length=1, max_length=64)]


@generation.post(
    "/v1/requests",
    status_code=202,
    response_model=dict[str, Any],  # documents the answer; the route returns it made
    responses=error_responses(400, 401, 404, 413, 429, 503),
)
async def create(
    body: NativeRequest, request: Request, admission: Admitted, session: SessionHeader = None
) -> Response:
    sub = await submit(
        admission.live(attach=False, session=session), body, body.prompt, max_tokens=body.max_tokens
    )
    answer = {
        "id": sub.id,
        "object": "request",
        "status": "queued",
        "model": sub.model,
        "created": sub.created,
        "prompt_tokens": sub.prompt_tokens,
        "max_tokens": sub.max_tokens,
        "events_url": f"/v1/requests/{sub.id}/events",
    }
    return JSONResponse(answer, status_code=202)


async def _record(state: AppState, request_id: str, owner: str | None) -> RequestRecord:
    """The request's record; another key's request is reported as missing.

    A record without the fields its creation wrote (a Redis failover can lose them
    while later writes land on the new primary: only ``status``, ``finish_reason``
    and the counts are left) says neither whose request it is nor what it was, so
    it is reported as missing too, with why, rather than failing the call.
    """
    fields: dict[str, str] = await state.redis.hgetall(keys.request(request_id))  # type: ignore[misc]
    if not fields:
        raise NotFound(f"no request '{request_id}'", param="id", code="request_not_found")
    try:
        record = RequestRecord.from_redis(fields)
    except ValidationError:
        log.warning("request %s: its record is incomplete: %s", request_id, sorted(fields))
        raise NotFound(
            f"no request '{request_id}': Redis lost the writes that created its record "
            "(a failover); what is left does not say whose it is",
            param="id",
            code="request_not_found",
        ) from None
    if owner is not None and record.owner != owner:
        raise NotFound(f"no request '{request_id}'", param="id", code="request_not_found")
    return record


@router.get("/v1/requests/{request_id}", responses=error_responses(401, 404))
async def status(request_id: RequestId, state: State, owner: Caller) -> dict[str, Any]:
    record = await _record(state, request_id, owner)
    body: dict[str, Any] = {"object": "request", **record.model_dump(exclude={"owner"})}
    body["queue_ms"] = _span(record.created_at, record.started_at)
    body["run_ms"] = _span(record.started_at, record.finished_at)
    return body


def _span(start: float | None, end: float | None) -> float | None:
    return round((end - start) * 1000, 3) if start is not None and end is not None else None


async def _events(state: AppState, record: RequestRecord, last_id: str) -> AsyncIterator[bytes]:
    # Read from the start, the stream is timed as an OpenAI response is (a resumed
    # read is not: its client already had the first token).
    timer = RelayTimer.since(state, record.model, record.created_at) if last_id == "0-0" else None
    async for batch in follow(state, record.id, last_id):
        if batch is IDLE:
            yield event_stream.KEEPALIVE
            continue
        frames = []
        for stream_id, event in batch:
            if timer is not None:
                if isinstance(event, TokensEvent):
                    timer.tokens()
                elif is_terminal(event):
                    timer.end()
            frames.append(event_stream.event(stream_id, event.type, event.model_dump_json()))
        yield b"".join(frames)  # what arrived together leaves in one send


@router.delete("/v1/requests/{request_id}", responses=error_responses(401, 404))
async def delete(request_id: RequestId, state: State, owner: Caller) -> dict[str, Any]:
    """Cancel: a queued request never runs; a running one stops within a token interval."""
    return await cancel_request(state, await _record(state, request_id, owner))


async def cancel_request(state: AppState, record: RequestRecord) -> dict[str, Any]:
    """Cancel the request of ``record`` unless it ended; the answer of ``DELETE``
    (the owner's route and the admin API's)."""
    if record.status in TERMINAL_STATUSES:
        return {"id": record.id, "object": "request", "status": record.status, "cancelled": False}
    was_queued = await cancel(state, record.model, record.id)
    return {
        "id": record.id,
        "object": "request",
        "status": "cancelled" if was_queued else "cancelling",
        "cancelled": True,
    }


@router.get(
    "/v1/requests/{request_id}/events",
    response_model=None,
    responses={200: EVENT_STREAM, **error_responses(400, 401, 404)},
)
async def events(
    request: Request,
    request_id: RequestId,
    state: State,
    owner: Caller,
    last_event_id: Annotated[str | None, Header()] = None,
    last_event_id_query: Annotated[str | None, Query(alias="last_event_id")] = None,
) -> event_stream.EventStream:
    resume = last_event_id or last_event_id_query or "0-0"
    if not valid_id(resume):
        raise InvalidRequest(
            "Last-Event-ID must be a stream id such as 1700000000000-0",
            param="Last-Event-ID",
            code="invalid_value",
        )
    record = await _record(state, request_id, owner)
    ended = ErrorEvent(code=REVOKED_CODE, message=REVOKED_MESSAGE)
    return event_stream.EventStream(
        _events(state, record, resume),
        until=_revoked(request, state, record),
        final=f"event: error\ndata: {ended.model_dump_json()}\n\n".encode(),
    )


async def _revoked(request: Request, state: AppState, record: RequestRecord) -> None:
    """Return once the reader's key is revoked, the request cancelled: nobody may read
    its result any more (the stream ends with an ``error`` event that has no id)."""
    await revoked(await admitted(request))
    await cancel(state, record.model, record.id)
