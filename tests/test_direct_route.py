"""The generation routes fill their own parameters (:mod:`api.direct_route`), and
answer every request exactly as FastAPI's resolution of the same signature would."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from fastapi import APIRouter, FastAPI, Request
from fastapi.routing import APIRoute
from starlette.responses import JSONResponse, Response

from api import errors
from api.admission.auth import Caller
from api.admission.limits import BodyLimit
from api.app import create_app
from api.bodies import ChatCompletionRequest
from api.direct_route import DirectRoute, SessionHeader
from llmq.metrics import Tally
from llmq.settings import ApiSettings
from llmq.tenants import Tenant

pytestmark = pytest.mark.timeout(30)

GENERATION_PATHS = {
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/embeddings",
    "/v1/requests",
}


async def _echo(
    body: ChatCompletionRequest, request: Request, owner: Caller, session: SessionHeader = None
) -> Response:
    return JSONResponse({"model": body.model, "owner": owner, "session": session})


class _OneTenant:
    """The tenancy of a deployment with only the default tenant, and no Redis."""

    def default(self) -> str:
        return "default"

    async def tenant(self, name: str) -> Tenant:
        return Tenant(name=name)

    async def key_tenant(self, key_digest: str) -> str | None:
        return None


def _state(keys: frozenset[str]) -> SimpleNamespace:
    """All of the app state that auth reads, whether the process drains, and its tally."""
    return SimpleNamespace(
        api_keys=keys,
        settings=ApiSettings(),
        tenancy=_OneTenant(),
        draining=asyncio.Event(),
        metrics=Tally(),
    )


def _app(route_class: type[APIRoute], keys: frozenset[str]) -> FastAPI:
    app = FastAPI()
    errors.install(app)
    router = APIRouter(route_class=route_class)
    router.post("/chat", response_model=None)(_echo)
    app.include_router(router)
    app.add_middleware(BodyLimit, max_bytes=4096)
    app.state.llmq = _state(keys)
    return app


@pytest.mark.parametrize("path", sorted(GENERATION_PATHS))
async def test_the_generation_routes_check_the_key_before_the_body(path: str) -> None:
    """FastAPI's resolution parses the body's JSON first: a request with a broken body
    and no key got 400. A DirectRoute asks for the key first, whatever the body."""
    app = create_app(ApiSettings())
    app.state.llmq = _state(frozenset({"sk-k"}))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        response = await client.post(
            path, headers={"content-type": "application/json"}, content=b"{broken"
        )
    assert response.status_code == 401, response.text
    assert response.json()["error"]["code"] == "invalid_api_key"


def test_a_direct_route_refuses_a_parameter_it_cannot_fill() -> None:
    async def endpoint(request: Request, limit: int) -> Response:
        return Response()

    router = APIRouter(route_class=DirectRoute)
    with pytest.raises(TypeError, match="'limit'"):
        router.post("/x")(endpoint)


VALID = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}

CASES: list[tuple[str, dict[str, str], bytes]] = [
    ("valid", {"content-type": "application/json"}, json.dumps(VALID).encode()),
    ("charset", {"content-type": "application/json; charset=utf-8"}, json.dumps(VALID).encode()),
    ("vendor json", {"content-type": "application/vnd.x+json"}, json.dumps(VALID).encode()),
    ("not json", {"content-type": "application/json"}, b"{not json"),
    ("not an object", {"content-type": "application/json"}, b"[1, 2]"),
    ("plain text", {"content-type": "text/plain"}, json.dumps(VALID).encode()),
    ("no content type", {}, json.dumps(VALID).encode()),
    ("empty", {"content-type": "application/json"}, b""),
    ("missing field", {"content-type": "application/json"}, b'{"model": "m"}'),
    ("strict type", {"content-type": "application/json"}, b'{"model": 5, "messages": []}'),
    (
        "nested",
        {"content-type": "application/json"},
        json.dumps({**VALID, "messages": [{"role": "nobody", "content": "x"}]}).encode(),
    ),
    (
        "session",
        {"content-type": "application/json", "x-session-id": "conversation-1"},
        json.dumps(VALID).encode(),
    ),
    (
        "session too long",
        {"content-type": "application/json", "x-session-id": "s" * 257},
        json.dumps(VALID).encode(),
    ),
    ("too large", {"content-type": "application/json"}, b" " * 5000),
]


async def _answers(app: FastAPI, headers: dict[str, str], body: bytes) -> tuple[int, Any]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        response = await client.post("/chat", headers=headers, content=body)
    return response.status_code, response.json()


@pytest.mark.parametrize("keys", [frozenset(), frozenset({"sk-k"})], ids=["no keys", "keys"])
@pytest.mark.parametrize(("case", "headers", "body"), CASES, ids=[c[0] for c in CASES])
async def test_a_direct_route_answers_as_fastapi_does(
    keys: frozenset[str], case: str, headers: dict[str, str], body: bytes
) -> None:
    for auth in ({}, {"authorization": "Bearer sk-k"}, {"authorization": "Bearer wrong"}):
        sent = {**headers, **auth}
        ours = await _answers(_app(DirectRoute, keys), sent, body)
        theirs = await _answers(_app(APIRoute, keys), sent, body)
        if keys and auth.get("authorization") != "Bearer sk-k" and theirs[0] != 413:
            # the key first, whatever the body (the size is checked before any route)
            assert ours[0] == 401 and theirs[0] in (400, 401), (case, auth)
        else:
            assert ours == theirs, (case, auth)


def test_the_openapi_document_still_declares_what_the_routes_read() -> None:
    doc = create_app(ApiSettings()).openapi()
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    body = chat["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/ChatCompletionRequest"}
    assert [p["name"] for p in chat["parameters"]] == ["X-Session-Id"]
    native = doc["paths"]["/v1/requests"]["post"]
    assert set(native["responses"]) >= {"202", "400", "401", "429"}
    assert "ChatCompletionRequest" in doc["components"]["schemas"]
