"""The API process: uvicorn serving :func:`api.app.create_app`.

On SIGTERM/SIGINT uvicorn stops accepting and waits for open responses. Streams
still open ``shutdown_grace_seconds`` later (their worker stopped, or their
request went back to the queue) are ended by the API with an error chunk and
``[DONE]`` (:func:`api.follow.end_open_streams`), before uvicorn's own deadline
would cut them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

import uvicorn
from fastapi import FastAPI

from api.app import create_app
from api.follow import end_open_streams
from api.state import AppState
from llmq.settings import ApiSettings

log = logging.getLogger(__name__)


class Server(uvicorn.Server):
    """uvicorn's server, ending the app's open streams cleanly at shutdown."""

    def __init__(self, config: uvicorn.Config, app: FastAPI, grace: float) -> None:
        super().__init__(config)
        self.llmq_app = app
        self.grace = grace

    async def _end_streams_later(self) -> None:
        await asyncio.sleep(self.grace)
        state: AppState | None = getattr(self.llmq_app.state, "llmq", None)
        if state is not None and (n := end_open_streams(state)):
            log.info("ended %d open stream(s) at shutdown", n)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        ender = asyncio.create_task(self._end_streams_later())
        try:
            await super().shutdown(sockets)
        finally:
            ender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ender


def serve(settings: ApiSettings) -> None:
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=int(settings.shutdown_grace_seconds) + 3,
        lifespan="on",
    )
    Server(config, app, settings.shutdown_grace_seconds).run()
