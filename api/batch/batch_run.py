"""Running one batch line: enqueue it as its live endpoint would, and collect its answer.

A line is admitted by the live endpoints' own code (:mod:`api.admission.submit`): the same
validation, choices, route hints and job, but in the batch band
(:class:`api.admission.submit.BatchBand`) and not attached to this process, so that it outlives
it. Its answer is read from the requests' streams by the code that answers the live
endpoint, from the stream's start: any API process collects it, however many times,
and gets the same body. The output line is OpenAI's
``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import Any

from fastapi.responses import Response

from api.admission.admission import Admission, BatchBand
from api.admission.submit import Submitted, submit_choices, submit_embedding
from api.batch import batch_lines
from api.batch.batch_store import BatchObject
from api.bodies import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from api.errors import ApiError
from api.extras import completion_extras
from api.openai_format import ChatFormat, CompletionFormat
from api.responses.responses_format import ResponseFormat
from api.responses.responses_input import ResponsesRequest, chat_request
from api.responses.responses_relay import ResponseRelay
from api.routes.embeddings import embedding_answer
from api.routes.openai import collect, error_of, error_status, submit_chat
from api.routes.responses import submit_turn
from api.state import AppState
from api.streams.fanin import merged

__all__ = ["Submitted", "collect_line", "submit_line"]


def identity(batch: BatchObject) -> str | None:
    """Whose a batch line's requests are: the batch's owner (its tenant: ``batch.tenant``)."""
    return batch.owner


async def submit_line(state: AppState, batch: BatchObject, body: dict[str, Any]) -> list[Submitted]:
    """Enqueue one line in the batch band; its requests (one per choice), its batch's
    tenant's (its quota, its share of the band)."""
    request = batch_lines.body_model(batch.endpoint, body)
    owner = identity(batch)
    band = BatchBand(batch.id, float(batch.expires_at))
    tenant = None if batch.tenant is None else await state.tenancy.tenant(batch.tenant)
    admission = Admission(state, owner, tenant, band=band)
    if isinstance(request, EmbeddingRequest):
        return [await submit_embedding(admission, request, request.texts())]
    if isinstance(request, ResponsesRequest):
        return [await submit_turn(admission, chat_request(request, []))]
    if isinstance(request, ChatCompletionRequest):
        return await submit_chat(admission, request)
    assert isinstance(request, CompletionRequest)
    return await submit_choices(
        admission,
        request,
        request.prompts(),
        max_tokens=request.max_tokens,
        extras=completion_extras(request),
    )


def encode_subs(subs: list[Submitted]) -> str:
    return json.dumps([asdict(s) for s in subs])


def decode_subs(raw: str) -> list[Submitted]:
    return [Submitted(**s) for s in json.loads(raw)]


def _answer(response: Response) -> tuple[int, dict[str, Any]]:
    return response.status_code, json.loads(bytes(response.body))


async def collect_line(
    state: AppState, batch: BatchObject, body: dict[str, Any], subs: list[Submitted]
) -> tuple[int, dict[str, Any]]:
    """The line's answer, as its live endpoint would give it: status code and body."""
    request = batch_lines.body_model(batch.endpoint, body)
    arrived = time.monotonic()
    if isinstance(request, EmbeddingRequest):
        return _answer(await embedding_answer(state, request, subs[0], keep=True))
    if isinstance(request, ResponsesRequest):
        sub = subs[0]
        relay = ResponseRelay(ResponseFormat(request, sub.id, sub.created, sub.model), sub, False)
        async for _, events in merged(state, [sub]):
            for _, event in events or ():
                relay.take(event)
        if relay.error is not None:
            return error_status(relay.error), error_of(relay.error)
        if relay.final is None:
            raise ApiError("the stream ended without a result", status=500)
        return 200, relay.final
    logprobs = bool(getattr(request, "logprobs", None))
    fmt: CompletionFormat = (
        ChatFormat(subs, False, logprobs=logprobs)
        if isinstance(request, ChatCompletionRequest)
        else CompletionFormat(subs, False, logprobs=logprobs)
    )
    return _answer(await collect(state, fmt, arrived))


def output_line(custom_id: str, subs: list[Submitted], status: int, body: dict[str, Any]) -> str:
    return json.dumps(
        {
            "id": f"batch_req_{subs[0].id}" if subs else f"batch_req_{custom_id}",
            "custom_id": custom_id,
            "response": {
                "status_code": status,
                "request_id": subs[0].id if subs else None,
                "body": body,
            },
            "error": None,
        }
    )


def error_line(custom_id: str, code: str, message: str) -> str:
    """A line that did not run (expired, cancelled, or refused when fed)."""
    return json.dumps(
        {
            "id": f"batch_req_{custom_id}",
            "custom_id": custom_id,
            "response": None,
            "error": {"code": code, "message": message},
        }
    )
