"""The Responses API: ``POST /v1/responses``, ``GET`` and ``DELETE /v1/responses/{id}``.

A response is one chat request in the queue (:mod:`api.responses.responses_input` translates
the body), relayed as a Response object or as typed ``response.*`` events
(:mod:`api.responses.responses_relay`). Like the chat route's, its request is attached to
this API process and cancelled when the client leaves. Unless ``store: false``,
the finished response is kept (:mod:`api.responses.responses_store`) for ``GET`` and for a
next turn's ``previous_response_id``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from api.admission.admission import Admission
from api.admission.auth import REVOKED_CODE, REVOKED_MESSAGE, Admitted, Caller, revoked
from api.admission.submit import Submitted, submit
from api.bodies import ChatCompletionRequest
from api.cancel import release_later, unless_disconnected
from api.direct_route import DirectRoute
from api.errors import ApiError, InvalidRequest, NotFound, json_error
from api.extras import Extras, chat_extras
from api.openapi import GENERATION_RESPONSES, error_responses
from api.responses import responses_store
from api.responses.responses_format import ResponseFormat
from api.responses.responses_input import ResponsesRequest, chat_request, conversation_messages
from api.responses.responses_relay import ResponseRelay
from api.responses.responses_store import StoredResponse
from api.routes.openai import CLIENT_CLOSED, error_of, error_status
from api.state import AppState, State
from api.streams import event_stream
from api.streams.fanin import merged
from api.streams.follow import IDLE
from api.timing import RelayTimer
from llmq.schema import TokensEvent

log = logging.getLogger(__name__)

router = APIRouter(tags=["responses"])
#: The generating route, on its first token's path (:mod:`api.direct_route`).
generation = APIRouter(tags=["responses"], route_class=DirectRoute)

#: Chat parameter names, as the Responses request calls them.
_PARAMS = {
    "response_format.json_schema.schema": "text.format.schema",
    "response_format.json_schema": "text.format",
    "response_format": "text.format",
}


def _responses_param(param: str | None) -> str | None:
    if param is None:
        return None
    if param.startswith("tools[") and ".function." in param:
        return param.replace(".function.", ".")
    return _PARAMS.get(param, param)


def _extras(chat: ChatCompletionRequest) -> Extras:
    try:
        return chat_extras(chat)
    except ApiError as exc:
        exc.param = _responses_param(exc.param)
        exc.message = exc.message.replace("response_format.json_schema", "text.format")
        raise


async def _history(state: AppState, body: ResponsesRequest, owner: str | None) -> list[Any]:
    if body.previous_response_id is None:
        return []
    stored = await responses_store.load(state.redis, body.previous_response_id, owner)
    if stored is None:
        raise InvalidRequest(
            f"Previous response with id '{body.previous_response_id}' not found "
            "(it expired, was not stored, or was made with another key)",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    return stored.conversation


async def submit_turn(admission: Admission, chat: ChatCompletionRequest) -> Submitted:
    """Enqueue a response's chat request (live, or a batch line in the admission's band)."""
    return await submit(
        admission,
        chat,
        chat.prompt_text(),
        max_tokens=chat.max_completion_tokens,
        max_tokens_param="max_output_tokens",
        prompt_param="input",
        extras=_extras(chat),
    )


@generation.post("/v1/responses", response_model=None, responses=GENERATION_RESPONSES)
async def create_response(
    body: ResponsesRequest, request: Request, admission: Admitted
) -> Response:
    arrived = time.monotonic()
    state, owner = admission.state, admission.owner
    body.refuse_unsupported()
    chat = chat_request(body, await _history(state, body, owner))
    if not chat.content_tokens_present():
        raise InvalidRequest("input must contain some text", param="input", code="invalid_value")
    sub = await submit_turn(admission.live(attach=True), chat)
    fmt = ResponseFormat(body, sub.id, sub.created, sub.model)
    turn = _Turn(state, fmt, sub, owner, conversation_messages(chat, body.instructions))
    if body.stream:
        ended = {"code": REVOKED_CODE, "message": REVOKED_MESSAGE, "param": None}
        return event_stream.EventStream(
            turn.stream(arrived),
            until=revoked(admission),
            final=lambda: fmt.event("error", ended),
        )
    relay = None
    try:
        relay = await unless_disconnected(request, turn.collect(arrived))
    finally:
        release_later(state, sub.model, sub.id, cancel=relay is None or not relay.finished)
    if relay is None:
        return Response(status_code=CLIENT_CLOSED)
    if relay.error is not None:
        return json_error(error_of(relay.error), error_status(relay.error))
    return JSONResponse(relay.final)


class _Turn:
    """One response being relayed, and stored once it ends."""

    def __init__(
        self,
        state: AppState,
        fmt: ResponseFormat,
        sub: Submitted,
        owner: str | None,
        conversation: list[dict[str, Any]],
    ) -> None:
        self.state, self.fmt, self.sub, self.owner = state, fmt, sub, owner
        self.conversation = conversation

    async def _store(self, relay: ResponseRelay) -> None:
        if not self.fmt.body.storing or relay.final is None:
            return
        stored = StoredResponse(
            owner=self.owner,
            response=relay.final,
            conversation=[*self.conversation, relay.assistant_message()],
        )
        await responses_store.save(
            self.state.redis, stored, self.state.policy.pool().request_ttl_seconds
        )

    async def collect(self, arrived: float) -> ResponseRelay:
        timer = RelayTimer(self.state, self.sub.model, arrived)
        relay = ResponseRelay(self.fmt, self.sub, streaming=False)
        async with contextlib.aclosing(merged(self.state, [self.sub])) as events:
            async for _, batch in events:
                for _, event in batch or ():
                    relay.take(event)
                    if isinstance(event, TokensEvent):
                        timer.tokens()
        if relay.final is None:
            raise ApiError("the stream ended without a result", status=500, code="internal_error")
        timer.end()
        await self._store(relay)
        return relay

    async def stream(self, arrived: float) -> AsyncIterator[bytes]:
        timer = RelayTimer(self.state, self.sub.model, arrived)
        relay = ResponseRelay(self.fmt, self.sub, streaming=True)
        try:
            yield relay.opening()
            async with contextlib.aclosing(merged(self.state, [self.sub])) as events:
                async for _, batch in events:
                    if batch is IDLE:
                        yield event_stream.KEEPALIVE
                        continue
                    frames: list[bytes] = []
                    for _, event in batch:
                        frames += relay.take(event)
                    if relay.finished:
                        await self._store(relay)  # readable before the client hears the end
                    if frames:
                        timer.tokens()
                        yield b"".join(frames)
            timer.end()
        except Exception as exc:
            # The status line is sent: end with an error event, not a cut stream.
            log.exception("stream of response %s failed", self.fmt.id)
            yield self.fmt.event(
                "error",
                {"code": "stream_failed", "message": f"the stream failed: {type(exc).__name__}"}
                | {"param": None},
            )
        finally:
            cancel = not relay.choice.finished
            release_later(self.state, self.sub.model, self.sub.id, cancel=cancel)


async def _found(state: AppState, response_id: str, owner: str | None) -> StoredResponse:
    stored = await responses_store.load(state.redis, response_id, owner)
    if stored is None:
        raise NotFound(
            f"No response with id '{response_id}' found (it expired, was not stored, or was "
            "made with another key)",
            param="response_id",
            code="response_not_found",
        )
    return stored


@router.get("/v1/responses/{response_id}", responses=error_responses(401, 404))
async def get_response(response_id: str, state: State, owner: Caller) -> dict[str, Any]:
    """A stored response (kept for ``LLMQ_REQUEST_TTL_SECONDS`` unless ``store: false``)."""
    return (await _found(state, response_id, owner)).response


@router.delete("/v1/responses/{response_id}", responses=error_responses(401, 404))
async def delete_response(response_id: str, state: State, owner: Caller) -> dict[str, Any]:
    await _found(state, response_id, owner)
    await responses_store.delete(state.redis, response_id, owner)
    return {"id": response_id, "object": "response.deleted", "deleted": True}
