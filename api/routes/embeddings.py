"""``POST /v1/embeddings``: vectors for one text or a list, through the queue.

The request is one job holding every input (:func:`api.admission.submit.submit_embedding`);
a worker whose model declares ``embeddings`` writes the vectors to the request's
stream as :class:`~llmq.schema.EmbeddingEvent` (base64 float32), then ``done``
with the usage. The answer is OpenAI's list of ``embedding`` objects, as floats
or, with ``encoding_format: base64``, as the base64 the worker wrote. Like a chat
request, it is attached to this process and cancelled if the client leaves.
"""

from __future__ import annotations

import base64
import contextlib
import struct
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from api.admission.auth import Admitted
from api.admission.submit import Submitted, submit_embedding
from api.bodies import EmbeddingRequest
from api.cancel import release_later, unless_disconnected
from api.direct_route import DirectRoute
from api.errors import ApiError, json_error
from api.openapi import GENERATION_RESPONSES
from api.routes.openai import CLIENT_CLOSED, error_of, error_status
from api.state import AppState
from api.streams.fanin import merged
from llmq.protocol import keys
from llmq.schema import DoneEvent, EmbeddingEvent, ErrorEvent

router = APIRouter(tags=["openai"], route_class=DirectRoute)


def floats(encoded: str) -> list[float]:
    """The components of a base64 little-endian float32 vector."""
    raw = base64.b64decode(encoded)
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


async def _vectors(
    state: AppState, sub: Submitted, count: int, *, keep: bool
) -> list[str] | JSONResponse:
    """The request's vectors in input order, or the error response of its failure.

    Once read, a live request's vectors leave the stream (``XDEL``): nobody resumes an
    embeddings request, and a large input would hold megabytes for the request's TTL.
    Its ``started`` and ``done`` stay, as every request's do. A batch line's stay
    (``keep``) until the stream expires: a feeder that takes over from one that died
    before recording the line reads them again."""
    vectors: dict[int, str] = {}
    entries: list[str] = []
    async with contextlib.aclosing(merged(state, [sub])) as events:
        async for _, batch in events:
            for entry_id, event in batch or ():
                if isinstance(event, EmbeddingEvent):
                    entries.append(entry_id)
                    for offset, vector in enumerate(event.vectors):
                        vectors.setdefault(event.index + offset, vector)
                elif isinstance(event, ErrorEvent):
                    return json_error(error_of(event), error_status(event))
                elif isinstance(event, DoneEvent) and len(vectors) == count:
                    if not keep:
                        await state.redis.xdel(keys.stream(sub.id), *entries)
                    return [vectors[i] for i in range(count)]
    raise ApiError("the stream ended without every vector", status=500, code="internal_error")


@router.post("/v1/embeddings", response_model=None, responses=GENERATION_RESPONSES)
async def embeddings(body: EmbeddingRequest, request: Request, admission: Admitted) -> Response:
    state = admission.state
    sub = await submit_embedding(admission.live(attach=True), body, body.texts())
    response = None
    try:
        response = await unless_disconnected(request, embedding_answer(state, body, sub))
    finally:
        release_later(state, sub.model, sub.id, cancel=response is None)
    if response is None:
        return Response(status_code=CLIENT_CLOSED)
    return response


async def embedding_answer(
    state: AppState, body: EmbeddingRequest, sub: Submitted, *, keep: bool = False
) -> JSONResponse:
    """The answer of an embeddings request: its vectors, or its error (``keep``: the
    vectors stay in the stream, for a batch line)."""
    result = await _vectors(state, sub, len(body.texts()), keep=keep)
    if isinstance(result, JSONResponse):
        return result
    as_base64 = body.encoding_format == "base64"
    data: list[dict[str, Any]] = [
        {"object": "embedding", "index": i, "embedding": v if as_base64 else floats(v)}
        for i, v in enumerate(result)
    ]
    usage = {"prompt_tokens": sub.prompt_tokens, "total_tokens": sub.prompt_tokens}
    return JSONResponse({"object": "list", "data": data, "model": sub.model, "usage": usage})
