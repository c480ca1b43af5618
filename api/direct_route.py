"""Routes on the first token's path, called without FastAPI's parameter resolution.

FastAPI resolves a route's parameters on every request: it walks the route's
dependency graph and reads the body as JSON, then validates the parsed objects. On a
generation route that CPU is spent between a request's arrival and its enqueue, so
every first token waits for it; filling the few kinds of parameter these routes take
directly costs less than half as much (docs/upstream-benchmark.md, "A first
token's path").

A :class:`DirectRoute` still declares its parameters in its endpoint's signature,
so the OpenAPI document is FastAPI's own, but fills them itself from a fixed set of
kinds, known when the route is made:

- the :class:`~starlette.requests.Request`;
- one request body, a pydantic model, validated from the JSON bytes in one call
  (its errors are FastAPI's :class:`~fastapi.exceptions.RequestValidationError`,
  answered by the same handler as any other route's);
- the caller (:data:`api.admission.auth.Caller`), or its admission
  (:data:`api.admission.auth.Admitted`);
- the ``X-Session-Id`` header (:data:`SessionHeader`).

Any other parameter is refused when the route is made, not on a request. The
caller is asked for first: a request without a valid key gets 401 before its body is
parsed (FastAPI parses the JSON first). The endpoint must return a
:class:`~starlette.responses.Response`.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable, Coroutine
from typing import Annotated, Any

from fastapi import Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, StringConstraints, TypeAdapter, ValidationError
from starlette.responses import Response

from api.admission.auth import Admitted, Caller, admitted, caller

SESSION_HEADER = "X-Session-Id"
SESSION_MAX_LENGTH = 256

#: A client's conversation, for session affinity (else the request's ``user``).
SessionHeader = Annotated[
    str | None,
    Header(
        alias=SESSION_HEADER,
        max_length=SESSION_MAX_LENGTH,
        description="A conversation's id: its requests prefer the worker that served it last "
        "(LLMQ_ROUTING=prefix); the request's user field is used when absent.",
    ),
]

Getter = Callable[[Request], Awaitable[Any]]


def _is_json(content_type: str | None) -> bool:
    """``application/json`` or ``application/*+json``, parameters ignored (as FastAPI)."""
    if not content_type:
        return False
    kind = content_type.partition(";")[0].strip().lower()
    return kind == "application/json" or (
        kind.startswith("application/") and kind.endswith("+json")
    )


def _refused(exc: ValidationError, *where: str) -> RequestValidationError:
    """pydantic's errors as FastAPI reports them: located in the request (``body``...)."""
    errors = exc.errors(include_url=False)
    return RequestValidationError([{**e, "loc": (*where, *e["loc"])} for e in errors])


def _body(model: type[BaseModel]) -> Getter:
    """Read and validate the body as ``model``, refused as FastAPI refuses it."""

    async def read(request: Request) -> BaseModel:
        raw = await request.body()
        try:
            if raw and _is_json(request.headers.get("content-type")):
                return model.model_validate_json(raw)
            # no body, or not JSON: FastAPI validates that as it is, which no model takes
            return model.model_validate(raw or None)
        except ValidationError as exc:
            raise _refused(exc, "body") from None

    return read


async def _request(request: Request) -> Request:
    return request


_SESSION = TypeAdapter(Annotated[str, StringConstraints(max_length=SESSION_MAX_LENGTH)])


async def _session(request: Request) -> str | None:
    value = request.headers.get(SESSION_HEADER)
    if value is None:
        return None
    try:
        return _SESSION.validate_python(value)
    except ValidationError as exc:
        raise _refused(exc, "header", SESSION_HEADER) from None


def _getter(name: str, annotation: Any) -> tuple[int, Getter]:
    """The getter of a parameter, with its rank: the caller first (a request without a
    valid key gets 401 whatever its body), then the header, the request, the body."""
    if annotation == Caller:
        return 0, caller
    if annotation == Admitted:
        return 0, admitted
    if annotation == SessionHeader:
        return 1, _session
    if annotation is Request:
        return 2, _request
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return 3, _body(annotation)
    raise TypeError(f"a DirectRoute cannot fill the parameter {name!r} ({annotation!r})")


class DirectRoute(APIRoute):
    """An :class:`~fastapi.routing.APIRoute` whose handler fills the endpoint's
    parameters itself (see the module's docstring); FastAPI documents it as usual."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        endpoint = self.endpoint
        hints = typing.get_type_hints(endpoint, include_extras=True)
        found = {
            name: _getter(name, hints[name]) for name in inspect.signature(endpoint).parameters
        }
        getters = [(name, get) for name, (_, get) in sorted(found.items(), key=lambda i: i[1][0])]

        async def handle(request: Request) -> Response:
            kwargs = {name: await get(request) for name, get in getters}
            response: Response = await endpoint(**kwargs)
            return response

        return handle
