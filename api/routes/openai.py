"""The OpenAI-compatible surface: completions, chat completions, models.

With ``stream: true`` the answer is SSE chunks in OpenAI's shape ending with
``data: [DONE]``; otherwise one JSON body with ``usage``. A failure after the
stream started is sent as a ``data: {"error": ...}`` chunk, then ``[DONE]``; a
generation timeout first closes the choice with ``finish_reason: "timeout"``.
A client that disconnects, streaming or not, cancels its request, and so does
the death of this API process (after ``orphan_grace_seconds``): an OpenAI client
cannot reconnect elsewhere, so its request is *attached* to this process.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from api import sse
from api.auth import Caller
from api.cancel import release_later, unless_disconnected
from api.errors import ApiError, error_body
from api.follow import IDLE, TokenCursor, follow
from api.openai_format import ChatFormat, CompletionFormat
from api.schemas import ChatCompletionRequest, CompletionRequest
from api.state import AppState, State, state_of
from api.submit import submit
from llmq import metrics
from llmq.schema import DoneEvent, ErrorEvent, TokensEvent

log = logging.getLogger(__name__)

router = APIRouter(tags=["openai"])

#: Status of a client that went away before its answer (nginx's convention).
CLIENT_CLOSED = 499


class _Timer:
    """TTFT and e2e as the API relays them, from the request's arrival at the handler."""

    def __init__(self, state: AppState, model: str, arrived: float) -> None:
        self.metrics, self.model, self.arrived = state.metrics, model, arrived
        self.first = False

    def tokens(self) -> None:
        if not self.first:
            self.first = True
            self.metrics.observe(metrics.TTFT, time.monotonic() - self.arrived, self.model)

    def end(self) -> None:
        self.metrics.observe(metrics.E2E, time.monotonic() - self.arrived, self.model)


def _error_status(event: ErrorEvent) -> int:
    return 504 if event.finish_reason == "timeout" else 500


def _error_of(event: ErrorEvent) -> dict[str, Any]:
    kind = "timeout_error" if event.finish_reason == "timeout" else "server_error"
    return error_body(event.message, kind, None, event.code)


async def _stream(state: AppState, fmt: CompletionFormat, arrived: float) -> AsyncIterator[bytes]:
    timer = _Timer(state, fmt.sub.model, arrived)
    finished = False
    try:
        opening = fmt.opening()
        if opening is not None:
            yield sse.data(opening)
        cursor = TokenCursor()
        async for item in follow(state, fmt.sub.id):
            if item is IDLE:
                yield sse.KEEPALIVE
                continue
            _, event = item
            if isinstance(event, TokensEvent):
                text = "".join(cursor.take(event))
                if text:
                    yield fmt.delta_frame(text)
                    timer.tokens()
            elif isinstance(event, DoneEvent):
                finished = True
                timer.end()
                yield sse.data(fmt.closing(event.finish_reason))
                if fmt.include_usage:
                    yield sse.data(fmt.usage_chunk(event.usage))
            elif isinstance(event, ErrorEvent):
                finished = True
                timer.end()
                if event.code == "generation_timeout":
                    yield sse.data(fmt.closing(event.finish_reason))
                yield sse.data(_error_of(event))
                if fmt.include_usage and event.usage:
                    yield sse.data(fmt.usage_chunk(event.usage))
        yield sse.DONE
    except Exception as exc:
        # The status line is sent: end the stream the way OpenAI does, not truncated.
        log.exception("stream of request %s failed", fmt.sub.id, extra={"request_id": fmt.sub.id})
        message = f"the stream failed: {type(exc).__name__}"
        yield sse.data(error_body(message, "server_error", None, "stream_failed"))
        yield sse.DONE
    finally:
        release_later(state, fmt.sub.model, fmt.sub.id, cancel=not finished)


async def _collect(state: AppState, fmt: CompletionFormat, arrived: float) -> Response:
    timer = _Timer(state, fmt.sub.model, arrived)
    cursor = TokenCursor()
    parts: list[str] = []
    async for item in follow(state, fmt.sub.id):
        if item is IDLE:
            continue
        _, event = item
        if isinstance(event, TokensEvent):
            parts.extend(cursor.take(event))
            timer.tokens()
        elif isinstance(event, DoneEvent):
            timer.end()
            return JSONResponse(fmt.full("".join(parts), event.finish_reason, event.usage))
        elif isinstance(event, ErrorEvent):
            timer.end()
            return JSONResponse(_error_of(event), _error_status(event))
    raise ApiError("the stream ended without a result", status=500, code="internal_error")


async def _respond(
    request: Request, state: AppState, fmt: CompletionFormat, stream: bool, arrived: float
) -> Response:
    if stream:
        return sse.EventStream(_stream(state, fmt, arrived))
    response = None
    try:
        response = await unless_disconnected(request, _collect(state, fmt, arrived))
    finally:
        release_later(state, fmt.sub.model, fmt.sub.id, cancel=response is None)
    if response is None:
        return Response(status_code=CLIENT_CLOSED)
    return response


@router.post("/v1/completions", response_model=None)
async def completions(body: CompletionRequest, request: Request, owner: Caller) -> Response:
    arrived = time.monotonic()
    state = state_of(request)
    sub = await submit(
        state, body, body.prompt_text(), max_tokens=body.max_tokens, owner=owner, attach=True
    )
    fmt = CompletionFormat(sub, body.include_usage)
    return await _respond(request, state, fmt, body.stream, arrived)


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(
    body: ChatCompletionRequest, request: Request, owner: Caller
) -> Response:
    arrived = time.monotonic()
    state = state_of(request)
    if not body.content_tokens_present():
        raise ApiError("messages must contain some text", param="messages", code="invalid_value")
    requested = body.max_completion_tokens or body.max_tokens
    param = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
    sub = await submit(
        state,
        body,
        body.prompt_text(),
        max_tokens=requested,
        max_tokens_param=param,
        prompt_param="messages",
        owner=owner,
        attach=True,
    )
    return await _respond(request, state, ChatFormat(sub, body.include_usage), body.stream, arrived)


@router.get("/v1/models")
async def models(state: State, _: Caller) -> dict[str, Any]:
    workers = await state.catalog.workers()
    first_seen: dict[str, float] = {}
    for w in workers:
        first_seen[w.model] = min(first_seen.get(w.model, w.started_at), w.started_at)
    return {
        "object": "list",
        "data": [
            {"id": m, "object": "model", "created": int(t), "owned_by": "llmq"}
            for m, t in sorted(first_seen.items())
        ],
    }
