"""The OpenAI-compatible surface: completions, chat completions, models.

With ``stream: true`` the answer is SSE chunks in OpenAI's shape ending with
``data: [DONE]``; otherwise one JSON body with ``usage``. A failure after the
stream started is sent as a ``data: {"error": ...}`` chunk, then ``[DONE]``; a
generation timeout first closes the choice with ``finish_reason: "abort"``
(``llmq_finish_reason: "timeout"``). Each choice of ``n`` > 1 or of a prompt list
is its own request (:mod:`api.streams.fanin` relays them together); one choice's error
ends the response and cancels the others.
A client that disconnects, streaming or not, cancels its request, and so does
the death of this API process (after ``orphan_grace_seconds``): an OpenAI client
cannot reconnect elsewhere, so its request is *attached* to this process.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from api.admission.admission import Admission
from api.admission.auth import REVOKED_CODE, REVOKED_MESSAGE, Admitted, Caller, revoked
from api.admission.submit import Submitted, submit_choices
from api.bodies import ChatCompletionRequest, CompletionRequest
from api.cancel import release_later, unless_disconnected
from api.direct_route import DirectRoute, SessionHeader
from api.errors import ApiError, NotFound, error_body, json_error
from api.extras import chat_extras, completion_extras
from api.openai_format import ChatFormat, ChoiceResult, CompletionFormat, UsageSum
from api.openapi import GENERATION_RESPONSES, error_responses
from api.state import AppState, State
from api.streams import event_stream
from api.streams.fanin import Item, merged
from api.streams.follow import IDLE, Batch, TokenCursor
from api.timing import RelayTimer
from llmq.schema import (
    DoneEvent,
    ErrorEvent,
    Event,
    TokenLogprob,
    TokensEvent,
    ToolCallEvent,
)

log = logging.getLogger(__name__)

router = APIRouter(tags=["openai"])
#: The generation routes, on every first token's path (:mod:`api.direct_route`).
generation = APIRouter(tags=["openai"], route_class=DirectRoute)

#: Status of a client that went away before its answer (nginx's convention).
CLIENT_CLOSED = 499


def error_status(event: ErrorEvent) -> int:
    """A failed request's status by whose fault it failed: 400 for the request's own
    (the model refused it), 5xx only for llmq's or the model's failures."""
    if event.refused or event.code == "unsupported_parameter":
        return 400
    return 504 if event.finish_reason == "timeout" else 500


def error_of(event: ErrorEvent) -> dict[str, Any]:
    if event.refused or event.code == "unsupported_parameter":
        return error_body(event.message, "invalid_request_error", event.param, event.code)
    kind = "timeout_error" if event.finish_reason == "timeout" else "server_error"
    return error_body(event.message, kind, None, event.code)


@dataclass
class RelayedChoice:
    """What one choice relayed so far: tokens without gaps or repeats, its tool call."""

    sub: Submitted
    cursor: TokenCursor = field(default_factory=TokenCursor)
    result: ChoiceResult = field(init=False)
    #: Token index from which the tokens are a tool call's arguments.
    tool_from: int | None = None
    finished: bool = False

    def __post_init__(self) -> None:
        self.result = ChoiceResult(self.sub.index)

    def tool(self, event: ToolCallEvent) -> bool:
        """Note a tool call; False if it was already noted (a re-run writes it again)."""
        if self.result.tool is not None:
            return False
        self.result.tool = (event.id, event.name)
        self.tool_from = event.index
        return True

    def take(self, event: TokensEvent) -> tuple[list[str], list[str], list[TokenLogprob] | None]:
        """The fresh tokens of ``event``: content, tool arguments, their logprobs."""
        start = max(self.cursor.next_index, event.index)
        fresh = self.cursor.take(event)
        logprobs = event.logprobs[len(event.tokens) - len(fresh) :] if event.logprobs else None
        cut = len(fresh) if self.tool_from is None else max(0, self.tool_from - start)
        return fresh[:cut], fresh[cut:], logprobs


async def _stream(state: AppState, fmt: CompletionFormat, arrived: float) -> AsyncIterator[bytes]:
    timer = RelayTimer(state, fmt.sub.model, arrived)
    choices = {s.index: RelayedChoice(s) for s in fmt.subs}
    usage = UsageSum()
    try:
        for chunk in fmt.opening():
            yield event_stream.data(chunk)
        async with contextlib.aclosing(merged(state, fmt.subs)) as events:
            async for index, batch in events:
                if batch is IDLE:
                    yield event_stream.KEEPALIVE
                    continue
                frames, ended = _batch_frames(fmt, choices[index], batch, usage, timer)
                if frames:  # what arrived together leaves in one send
                    yield frames[0] if len(frames) == 1 else b"".join(frames)
                if ended:
                    break  # one choice failed: the others are cancelled below
            else:
                if fmt.include_usage:
                    yield event_stream.data(fmt.usage_chunk(usage.total()))
        timer.end()
        yield event_stream.DONE
    except Exception as exc:
        # The status line is sent: end the stream the way OpenAI does, not truncated.
        log.exception("stream of request %s failed", fmt.sub.id, extra={"request_id": fmt.sub.id})
        message = f"the stream failed: {type(exc).__name__}"
        yield event_stream.data(error_body(message, "server_error", None, "stream_failed"))
        yield event_stream.DONE
    finally:
        for c in choices.values():
            release_later(state, c.sub.model, c.sub.id, cancel=not c.finished)


def _batch_frames(
    fmt: CompletionFormat, choice: RelayedChoice, batch: Batch, usage: UsageSum, timer: RelayTimer
) -> tuple[list[bytes], bool]:
    """The SSE frames of one choice's batch of events, and whether the response ends.

    Plain text, nearly every event of every stream, is framed here directly; the
    rest goes through :func:`_frames`."""
    out: list[bytes] = []
    for _, event in batch:
        if type(event) is TokensEvent and event.logprobs is None and choice.tool_from is None:
            fresh = choice.cursor.take(event)
            if fresh:
                out.append(fmt.delta_frame("".join(fresh), choice.sub.index))
                timer.tokens()
            continue
        frames, ended = _frames(fmt, choice, event, usage)
        if frames:
            out += frames
            if isinstance(event, TokensEvent):
                timer.tokens()
        if ended:
            return out, True
    return out, False


def _frames(
    fmt: CompletionFormat, choice: RelayedChoice, event: Event, usage: UsageSum
) -> tuple[list[bytes], bool]:
    """The SSE frames of one choice's event, and whether the response ends with it."""
    index = choice.sub.index
    if isinstance(event, TokensEvent):
        return _token_frames(fmt, choice, event), False
    if isinstance(event, ToolCallEvent):
        opened = fmt.tool_start(index, event.id, event.name) if choice.tool(event) else None
        return ([event_stream.data(opened)] if opened is not None else []), False
    if isinstance(event, DoneEvent):
        choice.finished = True
        usage.add(choice.sub, event.usage)
        tool_called = choice.tool_from is not None
        return [event_stream.data(fmt.closing(event.finish_reason, index, tool_called))], False
    if isinstance(event, ErrorEvent):
        choice.finished = True
        frames = []
        if event.code == "generation_timeout":
            frames.append(event_stream.data(fmt.closing(event.finish_reason, index)))
        frames.append(event_stream.data(error_of(event)))
        if fmt.include_usage and event.usage and len(fmt.subs) == 1:
            frames.append(event_stream.data(fmt.usage_chunk(event.usage)))
        return frames, True
    return [], False


def _token_frames(fmt: CompletionFormat, choice: RelayedChoice, event: TokensEvent) -> list[bytes]:
    text, arguments, logprobs = choice.take(event)
    index = choice.sub.index
    frames = []
    if text:
        if logprobs is None:
            frames.append(fmt.delta_frame("".join(text), index))
        else:
            pairs = list(zip(text, logprobs, strict=False))
            frames.append(event_stream.data(fmt.delta("".join(text), index, pairs)))
    if arguments:
        frames.append(event_stream.data(fmt.tool_arguments(index, "".join(arguments))))
    return frames


async def collect(state: AppState, fmt: CompletionFormat, arrived: float) -> Response:
    """The whole answer of a non-streaming request (or of a batch line): JSON or error."""
    timer = RelayTimer(state, fmt.sub.model, arrived)
    choices = {s.index: RelayedChoice(s) for s in fmt.subs}
    usage = UsageSum()
    async with contextlib.aclosing(merged(state, fmt.subs)) as events:
        return await _gather(fmt, choices, usage, timer, events)


async def _gather(
    fmt: CompletionFormat,
    choices: dict[int, RelayedChoice],
    usage: UsageSum,
    timer: RelayTimer,
    events: AsyncIterator[tuple[int, Item]],
) -> Response:
    async for index, batch in events:
        if batch is IDLE:
            continue
        for _, event in batch:
            response = _gathered(fmt, choices, usage, timer, choices[index], event)
            if response is not None:
                return response
    raise ApiError("the stream ended without a result", status=500, code="internal_error")


def _gathered(
    fmt: CompletionFormat,
    choices: dict[int, RelayedChoice],
    usage: UsageSum,
    timer: RelayTimer,
    choice: RelayedChoice,
    event: Event,
) -> Response | None:
    """Take one event of ``choice`` into its result; the response once it is complete."""
    result = choice.result
    if isinstance(event, TokensEvent):
        text, arguments, logprobs = choice.take(event)
        result.text.extend(text)
        result.arguments.extend(arguments)
        if logprobs is not None:
            result.logprobs = (result.logprobs or []) + list(zip(text, logprobs, strict=False))
        timer.tokens()
    elif isinstance(event, ToolCallEvent):
        choice.tool(event)
    elif isinstance(event, DoneEvent):
        choice.finished = True
        result.finish = event.finish_reason
        usage.add(choice.sub, event.usage)
        if all(c.finished for c in choices.values()):
            timer.end()
            return JSONResponse(fmt.full([c.result for c in choices.values()], usage.total()))
    elif isinstance(event, ErrorEvent):
        choice.finished = True
        timer.end()
        return json_error(error_of(event), error_status(event))
    return None


async def _respond(
    request: Request, admission: Admission, fmt: CompletionFormat, stream: bool, arrived: float
) -> Response:
    state = admission.state
    if stream:
        ended = error_body(REVOKED_MESSAGE, "invalid_request_error", code=REVOKED_CODE)
        return event_stream.EventStream(
            _stream(state, fmt, arrived),
            until=revoked(admission),
            final=event_stream.data(ended) + event_stream.DONE,
        )
    response = None
    try:
        response = await unless_disconnected(request, collect(state, fmt, arrived))
    finally:
        # Every choice that did not end is cancelled: a disconnect, or one choice's error.
        finished = response is not None and response.status_code == 200
        for sub in fmt.subs:
            release_later(state, sub.model, sub.id, cancel=not finished)
    if response is None:
        return Response(status_code=CLIENT_CLOSED)
    return response


@generation.post("/v1/completions", response_model=None, responses=GENERATION_RESPONSES)
async def completions(
    body: CompletionRequest, request: Request, admission: Admitted, session: SessionHeader = None
) -> Response:
    arrived = time.monotonic()
    subs = await submit_choices(
        admission.live(attach=True, session=session),
        body,
        body.prompts(),
        max_tokens=body.max_tokens,
        extras=completion_extras(body),
    )
    fmt = CompletionFormat(subs, body.include_usage, logprobs=body.logprobs is not None)
    return await _respond(request, admission, fmt, body.streaming, arrived)


async def submit_chat(admission: Admission, body: ChatCompletionRequest) -> list[Submitted]:
    """Enqueue a chat request's choices (live, or a batch line in the admission's band)."""
    requested = body.max_completion_tokens or body.max_tokens
    param = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
    return await submit_choices(
        admission,
        body,
        [body.prompt_text()],
        max_tokens=requested,
        max_tokens_param=param,
        prompt_param="messages",
        extras=chat_extras(body),
        messages=body.message_dicts(),
    )


@generation.post("/v1/chat/completions", response_model=None, responses=GENERATION_RESPONSES)
async def chat_completions(
    body: ChatCompletionRequest,
    request: Request,
    admission: Admitted,
    session: SessionHeader = None,
) -> Response:
    arrived = time.monotonic()
    if not body.content_tokens_present():
        raise ApiError("messages must contain some text", param="messages", code="invalid_value")
    subs = await submit_chat(admission.live(attach=True, session=session), body)
    fmt = ChatFormat(subs, body.include_usage, logprobs=bool(body.logprobs))
    return await _respond(request, admission, fmt, body.streaming, arrived)


async def _served(state: AppState) -> dict[str, float]:
    """Each served model and when its longest-running live worker started."""
    first_seen: dict[str, float] = {}
    for w in await state.catalog.workers():
        first_seen[w.model] = min(first_seen.get(w.model, w.started_at), w.started_at)
    return first_seen


def _model_object(model: str, created: float) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": int(created), "owned_by": "llmq"}


@router.get("/v1/models", responses=error_responses(401))
async def models(state: State, _: Caller) -> dict[str, Any]:
    served = await _served(state)
    return {"object": "list", "data": [_model_object(m, t) for m, t in sorted(served.items())]}


@router.get("/v1/models/{model:path}", responses=error_responses(401, 404))
async def model(model: str, state: State, _: Caller) -> dict[str, Any]:
    """One served model (the SDK's ``models.retrieve``); 404 if no live worker serves it."""
    served = await _served(state)
    if model not in served:
        raise NotFound(
            f"the model '{model}' does not exist or no worker serves it",
            param="model",
            code="model_not_found",
        )
    return _model_object(model, served[model])
