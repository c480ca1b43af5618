"""The OpenAPI document says what the API does: the statuses it answers, with
OpenAI's error body, and ``text/event-stream`` where it streams.

FastAPI documents a 422 for every route with parameters; the API never sends
one (validation errors are 400s in OpenAI's shape), so :func:`install` drops it,
and the routes list their real error statuses with :func:`error_responses`.
Generated clients and schemathesis then see the truth.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    """Every error, from every endpoint: ``{"error": {message, type, param, code}}``."""

    error: ErrorDetail


_WHEN = {
    400: "Invalid request (OpenAI's invalid_request_error), or a parameter the model "
    "cannot honour (code unsupported_parameter).",
    401: "API keys are on and the request has no valid key (the admin API: no admin key).",
    403: "The admin API, called with a tenant's key rather than an admin key.",
    404: "Unknown model, request or route.",
    413: "The body is larger than LLMQ_MAX_BODY_BYTES.",
    429: "The model's queue is full (Retry-After, x-should-retry: true).",
    500: "The model failed on the request after its retries.",
    503: "No live worker, or Redis unreachable (Retry-After, x-should-retry: true).",
    504: "A non-streaming request hit its queue or generation timeout.",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses`` of a route that answers ``statuses`` with the error body."""
    return {s: {"model": ErrorBody, "description": _WHEN[s]} for s in statuses}


#: A stream of Server-Sent Events.
EVENT_STREAM: dict[str, Any] = {
    "description": "Server-Sent Events.",
    "content": {"text/event-stream": {"schema": {"type": "string"}}},
}

#: What the generation routes answer: JSON, or SSE chunks with ``stream: true``.
GENERATION_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The completion; with stream: true, SSE chunks ending with data: [DONE].",
        "content": {
            "application/json": {"schema": {"type": "object"}},
            "text/event-stream": {"schema": {"type": "string"}},
        },
    },
    **error_responses(400, 401, 404, 413, 429, 500, 503, 504),
}


def install(app: FastAPI) -> None:
    """Serve the document without FastAPI's 422s (and their unused schemas)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            for path in doc.get("paths", {}).values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            schemas = doc.get("components", {}).get("schemas", {})
            for name in ("HTTPValidationError", "ValidationError"):
                schemas.pop(name, None)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
