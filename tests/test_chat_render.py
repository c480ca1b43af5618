"""The API's client for engines' chat renderings (:mod:`api.chat_render`) leaves no
connection behind: closed at shutdown, it opens none again.

The engine is a stand-in (a real uvicorn server in the test's event loop) that answers
``POST /apply-template`` as llama.cpp does; :mod:`tests.test_chat_routing` runs the real
engines.
"""

from __future__ import annotations

import json

import pytest
from starlette.types import Receive, Scope, Send

from api.chat_render import ChatRendering
from llmq.embedded import free_port
from llmq.model.tokenizer import WHITESPACE
from tests.support.servers import request_body, start_uvicorn
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(30)

RENDERED = "<<user>> hello <<assistant>>"


class ApplyTemplate:
    """Answers every request with :data:`RENDERED` as its ``prompt``; counts them."""

    def __init__(self) -> None:
        self.asked = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        await request_body(receive)
        self.asked += 1
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        body = json.dumps({"prompt": RENDERED}).encode()
        await send({"type": "http.response.body", "body": body})


async def test_a_closed_rendering_asks_no_engine_and_leaves_no_connection() -> None:
    """A request admitted while the API process stops, after the rendering was closed,
    gets the plain names (None): it opens no client that nobody would close, whose
    connection would stay open until garbage collection finds it."""
    engine = ApplyTemplate()
    port = free_port()
    server, task = start_uvicorn(engine, port)
    await wait_until(lambda: server.started, timeout=10, what="the stand-in engine to start")
    renderer = {"url": f"http://127.0.0.1:{port}/apply-template", "answer": "prompt"}
    rendering = ChatRendering()
    try:
        first = [{"role": "user", "content": "hello"}]
        assert await rendering.render(renderer, first, WHITESPACE) == tuple(
            WHITESPACE.tokens(RENDERED)
        )
        await rendering.aclose()
        await wait_until(
            lambda: not server.server_state.connections,
            timeout=5,
            what="the closed rendering's connection to end",
        )
        later = [{"role": "user", "content": "while stopping"}]
        assert await rendering.render(renderer, later, WHITESPACE) is None
        assert engine.asked == 1
        assert not server.server_state.connections
    finally:
        await rendering.aclose()
        server.should_exit = True
        await task
