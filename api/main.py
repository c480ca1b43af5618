"""The API process: uvicorn serving :func:`api.app.create_app`.

With ``api_processes`` > 1, ``llmq api`` (:mod:`cli.api_processes`) runs N of
these under :mod:`cli.supervisor`, each told to bind the port with
``SO_REUSEPORT`` (the kernel spreads connections over them). Each is a complete
API process: its own relay, its own liveness lease and attached requests, its own
Redis pools. They share nothing but Redis, exactly like API replicas on different
hosts.

On SIGTERM/SIGINT the process first *drains* (:meth:`Server.drain`): readiness fails
and every response closes its connection, while idle keep-alive connections are given
until they are used once more or time out, so that a client does not send a request
on a connection at the moment the process closes it (a reset that would leave the
client not knowing whether its request was taken). Then uvicorn stops accepting and
waits for open responses. At once, at the SIGTERM,
the process hands its batch feeding over (:meth:`api.batch.batch_feeder.BatchFeeder.hand_over`:
the lease is given up, the lines it was collecting are collected by the next feeder,
none is failed). Streams still open ``shutdown_grace_seconds`` later (their worker
stopped, or their request went back to the queue) are ended by the API with an error
chunk and ``[DONE]`` (:func:`api.streams.follow.end_open_streams`), before uvicorn's own
deadline would cut them (the grace counts from the drain's end).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import Any

import uvicorn
from fastapi import FastAPI

from api.app import create_app
from api.batch.batch_feeder import BatchFeeder
from api.state import AppState
from api.streams.follow import end_open_streams
from llmq.collector import tune_garbage_collector
from llmq.settings import ApiSettings

log = logging.getLogger(__name__)


#: How long after the keep-alive timeout a drain may last, and how often it looks.
DRAIN_MARGIN_SECONDS = 0.5
DRAIN_POLL_SECONDS = 0.05


def _idle(connection: Any) -> bool:
    """A connection between requests (uvicorn's own test in its protocols' ``shutdown``)."""
    cycle = getattr(connection, "cycle", None)
    return cycle is None or bool(cycle.response_complete)


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

    async def _hand_over_batches(self) -> None:
        feeder: BatchFeeder | None = getattr(self.llmq_app.state, "batch_feeder", None)
        if feeder is not None:
            await feeder.hand_over()

    async def drain(self) -> None:
        """Fail readiness and close each connection after its next response, until no
        connection is idle (a request may come on an idle one) or the keep-alive timeout
        has passed (uvicorn has closed every connection idle that long)."""
        state: AppState | None = getattr(self.llmq_app.state, "llmq", None)
        if state is None:
            return
        state.draining.set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.timeout_keep_alive + DRAIN_MARGIN_SECONDS
        while loop.time() < deadline and any(map(_idle, self.server_state.connections)):
            await asyncio.sleep(DRAIN_POLL_SECONDS)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        handing = asyncio.create_task(self._hand_over_batches())
        ender: asyncio.Task[None] | None = None
        try:
            await self.drain()
            ender = asyncio.create_task(self._end_streams_later())
            await super().shutdown(sockets)
        finally:
            if ender is not None:
                ender.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await ender
            await handing  # bounded: HAND_OVER_SECONDS per wait


def _server(settings: ApiSettings) -> Server:
    app = create_app(settings)
    tune_garbage_collector()
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=int(settings.shutdown_grace_seconds) + 3,
        lifespan="on",
    )
    return Server(config, app, settings.shutdown_grace_seconds)


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A listening socket that other processes may bind to the same address too."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock


def serve(settings: ApiSettings, *, reuse_port: bool = False) -> None:
    """Serve until SIGTERM/SIGINT; ``reuse_port``: one of several processes that
    share the port (``llmq api --api-processes N``)."""
    server = _server(settings)
    if reuse_port:
        server.run(sockets=[reuse_port_socket(settings.host, settings.port)])
    else:
        server.run()
