"""The API process: uvicorn serving :func:`api.app.create_app`, once or N times on one port.

With ``api_processes`` > 1 the command becomes a small supervisor of N API
processes. Each binds the same port with ``SO_REUSEPORT`` (the kernel spreads
connections over them) and is a complete API process: its own relay, its own
liveness lease and attached requests, its own Redis pools. They share nothing
but Redis, exactly like API replicas on different hosts. If one exits on its
own, the others are stopped and the command exits non-zero, so whatever runs it
(``llmq run``, compose, systemd) sees the failure; SIGTERM or SIGINT stops them
all gracefully.

On SIGTERM/SIGINT uvicorn stops accepting and waits for open responses. Streams
still open ``shutdown_grace_seconds`` later (their worker stopped, or their
request went back to the queue) are ended by the API with an error chunk and
``[DONE]`` (:func:`api.follow.end_open_streams`), before uvicorn's own deadline
would cut them.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import multiprocessing
import multiprocessing.connection
import signal
import socket
import sys
from types import FrameType

import uvicorn
from fastapi import FastAPI

from api.app import create_app
from api.follow import end_open_streams
from api.state import AppState
from llmq.collector import tune_garbage_collector
from llmq.logs import setup_logging
from llmq.settings import ApiSettings

log = logging.getLogger(__name__)

STOP_SECONDS = 15.0
_PR_SET_PDEATHSIG = 1


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
    sock.set_inheritable(True)
    return sock


def _serve_child(settings: ApiSettings) -> None:
    """One of N API processes (in a fresh interpreter): dies with its supervisor."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
    setup_logging(settings, "api")
    sock = reuse_port_socket(settings.host, settings.port)
    _server(settings).run(sockets=[sock])


def serve(settings: ApiSettings) -> None:
    if settings.api_processes == 1:
        _server(settings).run()
        return
    sys.exit(_supervise(settings))


def _supervise(settings: ApiSettings) -> int:
    context = multiprocessing.get_context("spawn")
    children = [
        context.Process(target=_serve_child, args=(settings,), name=f"api-{i + 1}")
        for i in range(settings.api_processes)
    ]
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for child in children:
            child.start()
        log.info(
            "serving on %s:%d with %d API processes", settings.host, settings.port, len(children)
        )
        while not stopping:
            multiprocessing.connection.wait([c.sentinel for c in children], timeout=0.2)
            if not stopping and any(not c.is_alive() for c in children):
                dead = [c for c in children if not c.is_alive()]
                log.error(
                    "API process %s exited with code %s; stopping the others",
                    dead[0].name,
                    dead[0].exitcode,
                )
                break
    finally:
        for child in children:
            if child.is_alive() and child.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    child.terminate()
        for child in children:
            child.join(STOP_SECONDS)
            if child.is_alive():
                child.kill()
                child.join()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0 if stopping and all(c.exitcode in (0, -signal.SIGTERM) for c in children) else 1
