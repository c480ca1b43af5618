"""The llmq parts the fixtures in ``conftest.py`` start, as types a test can name.

``start_worker`` and ``start_api`` run real workers and a real uvicorn server in
the test's event loop; these are their handles, and ``FAST_MODEL`` the mock
model timings that keep tests quick while tokens still arrive one by one.
:func:`start_uvicorn` runs any ASGI app so (the API, a stand-in for another
server).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import openai
import uvicorn
from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.state import AppState
from llmq.settings import ApiSettings, WorkerSettings
from tests.support.processes import Proc

#: Fast model timings so that tests are quick but tokens still arrive one by one; the
#: mock never stops by itself, so that answers have the length a test asks for.
FAST_MODEL = {
    "model_tokens_per_second": 200.0,
    "model_prefill_seconds_per_token": 0.0001,
    "model_mean_tokens": 0,
}


def start_uvicorn(
    app: ASGIApp, port: int, *, lifespan: Literal["on", "off"] = "off"
) -> tuple[uvicorn.Server, asyncio.Task[None]]:
    """A real uvicorn server for ``app`` on ``port``, in this event loop: it has
    started once ``server.started``; ``should_exit``, then the task, stop it."""
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_config=None,
        access_log=False,
        lifespan=lifespan,
        timeout_graceful_shutdown=2,
    )
    server = uvicorn.Server(config)
    return server, asyncio.create_task(server.serve())


async def request_body(receive: Receive) -> bytes:
    """An ASGI request's whole body."""
    body = b""
    while True:
        message = await receive()
        body += bytes(message.get("body", b""))
        if not message.get("more_body"):
            return body


@dataclass
class RunningWorker:
    settings: WorkerSettings
    stop: asyncio.Event
    task: asyncio.Task[None]

    async def close(self) -> None:
        self.stop.set()
        async with asyncio.timeout(30):
            await self.task


StartWorker = Callable[..., Awaitable[RunningWorker]]


class ResponseLog:
    """Pure ASGI wrapper that notes the status of every response, as an access log would.

    It sees what the app answered even when the client is gone (a 499).
    """

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.statuses: list[tuple[str, str, int]] = []  # method, path, status

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def noted(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.statuses.append((scope["method"], scope["path"], message["status"]))
            await send(message)

        await self.app(scope, receive, noted)


@dataclass
class RunningApi:
    settings: ApiSettings
    server: uvicorn.Server
    task: asyncio.Task[None]
    responses: ResponseLog

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.settings.port}"

    def client(self, **kwargs: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, **{"timeout": 30, **kwargs})

    def sdk(self, api_key: str = "unused") -> openai.AsyncOpenAI:
        """The openai SDK against this API, without retries (close it: ``async with``)."""
        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0)

    def app_state(self) -> AppState:
        """The running app's state (its process id, Redis client...)."""
        state: AppState = self.responses.app.state.llmq
        return state


StartApi = Callable[..., Awaitable[RunningApi]]


SpawnWorkers = Callable[..., Awaitable[list[Proc]]]
