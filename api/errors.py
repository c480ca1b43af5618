"""One error shape for every endpoint: OpenAI's ``{"error": {message, type, param, code}}``.

Handlers are registered in one place (:func:`install`). Errors from Redis are
translated at this boundary into 503s, so a client never sees a stack trace or a
hang when the backend is away; an exhausted connection pool is this process being
busy, not Redis being away, and is answered as overload (429 ``server_busy``).

Every error response says whether a retry can help, in the ``x-should-retry``
header that the openai SDKs (Python and Node) obey: ``true`` (with
``Retry-After``) for 429 and 503, ``false`` for everything else. Without it the
SDKs resend every 5xx, so one timed-out call (504) became three requests.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MaxConnectionsError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.bodies import UNSUPPORTED
from llmq.connection import PoolExhausted

log = logging.getLogger(__name__)


class ApiError(Exception):
    """An error the client should see, with its HTTP status and OpenAI fields."""

    status = 400
    type = "invalid_request_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        status: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        if status is not None:
            self.status = status
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


class InvalidRequest(ApiError):
    status = 400


class Unsupported(InvalidRequest):
    """A valid request the serving model cannot honour (vLLM also answers 400)."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message, param=param, code="unsupported_parameter")


class NotFound(ApiError):
    status = 404


class Overloaded(ApiError):
    status = 429
    type = "rate_limit_error"


class Unavailable(ApiError):
    status = 503
    type = "service_unavailable"


def error_body(
    message: str, type_: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


#: Statuses that a retry can fix: the queue is full, or no worker / Redis for now.
RETRYABLE = frozenset({429, 503})


def retry_headers(status: int, headers: Mapping[str, str] | None = None) -> dict[str, str]:
    """``headers`` plus ``x-should-retry`` (and ``Retry-After`` where a retry helps)."""
    out = dict(headers or {})
    retry = status in RETRYABLE
    out["x-should-retry"] = "true" if retry else "false"
    if retry:
        out.setdefault("Retry-After", "1")
    return out


def error_response(
    status: int,
    message: str,
    type_: str,
    param: str | None = None,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    return json_error(error_body(message, type_, param, code), status, headers)


def json_error(
    body: dict[str, Any], status: int, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """The one way an error response is made: the body, with the retry headers."""
    return JSONResponse(body, status, headers=retry_headers(status, headers))


#: pydantic's error types for a body that is not a JSON object at all.
_NOT_AN_OBJECT = frozenset({"model_attributes_type", "dict_type", "model_type", "missing"})

_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none", "literal"})


def _param(loc: tuple[int | str, ...]) -> str | None:
    """``("body", "messages", 0, "role")`` -> ``messages[0].role``; union tags dropped."""
    out = ""
    for part in loc:
        if part == "body" and not out:
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.lower() in _TYPE_TAGS or "[" in part or "-" in part:
            continue
        else:
            out += f".{part}" if out else part
    return out or None


async def _api_error(_: Request, exc: Exception) -> JSONResponse:
    if not isinstance(exc, ApiError):  # pragma: no cover - registered for ApiError only
        raise exc
    return json_error(exc.body(), exc.status, exc.headers)


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    if not isinstance(exc, RequestValidationError):  # pragma: no cover
        raise exc
    first = exc.errors()[0] if exc.errors() else {"msg": "invalid request", "loc": ()}
    if first.get("type") == "json_invalid":
        return error_response(
            400, "the request body is not valid JSON", "invalid_request_error", code="invalid_json"
        )
    loc = tuple(first.get("loc", ()))
    if loc == ("body",) and first.get("type") in _NOT_AN_OBJECT:
        message = "the request body must be a JSON object, sent with Content-Type: application/json"
        return error_response(400, message, "invalid_request_error", code="invalid_json")
    param = _param(loc)
    message = f"{param}: {first['msg']}" if param else str(first["msg"])
    code = UNSUPPORTED if first.get("type") == UNSUPPORTED else "invalid_value"
    return error_response(400, message, "invalid_request_error", param, code)


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    if not isinstance(exc, StarletteHTTPException):  # pragma: no cover
        raise exc
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return error_response(
        exc.status_code, str(exc.detail), kind, headers=dict(exc.headers) if exc.headers else None
    )


async def _redis_error(_: Request, exc: Exception) -> JSONResponse:
    log.warning("Redis unavailable: %s", exc)
    return error_response(
        503,
        "the queue backend is unavailable, retry shortly",
        "service_unavailable",
        code="backend_unavailable",
        headers={"Retry-After": "1"},
    )


async def _pool_exhausted(_: Request, exc: Exception) -> JSONResponse:
    log.warning("Redis connection pool exhausted: %s", exc)
    return error_response(
        429,
        "the server is busy, retry shortly",
        "rate_limit_error",
        code="server_busy",
        headers={"Retry-After": "1"},
    )


async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error", exc_info=exc)
    return error_response(500, "internal server error", "server_error", code="internal_error")


def install(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(PoolExhausted, _pool_exhausted)
    # The cluster client's own pool does not wait: a node whose connections are all
    # busy fails at once. Overload too, not an outage.
    app.add_exception_handler(MaxConnectionsError, _pool_exhausted)
    app.add_exception_handler(RedisConnectionError, _redis_error)
    app.add_exception_handler(RedisTimeoutError, _redis_error)
    app.add_exception_handler(Exception, _unexpected)
