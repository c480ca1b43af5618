"""The FastAPI application: its lifespan owns every resource of the process."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import secrets
import socket
from collections.abc import AsyncIterator
from typing import Any, NoReturn, cast

from fastapi import FastAPI
from redis.asyncio import Redis, RedisCluster
from starlette.types import Message, Receive, Scope, Send

from api import errors, openapi
from api.admission.flow import RateLimitHeaders
from api.admission.limits import BodyLimit
from api.admission.tenancy import Tenancy
from api.batch.batch_feeder import BatchFeeder
from api.catalog import Catalog
from api.routes import admin as admin_routes
from api.routes import batches, embeddings, files, health, native, openai, responses
from api.routes import metrics as metrics_routes
from api.state import AppState
from api.streams import event_stream
from api.streams.grouped_relay import GroupedRelay
from api.streams.relay import StreamRelay
from api.traced import UNTRACED, TraceRequests
from llmq import __version__, metrics, tracing
from llmq.connection import connect, is_cluster
from llmq.metrics import Tally
from llmq.policy import live as live_policy
from llmq.policy.model import DEFAULT
from llmq.protocol import keys
from llmq.protocol.queue import Queue
from llmq.protocol.sweep import sweep_forever
from llmq.settings import ApiSettings
from llmq.tasks import run_periodically, stop_tasks
from llmq.tenants import TenantStore, load_file, unused_weights

log = logging.getLogger(__name__)


async def _warn_unused_weights(redis: Redis, fairness: str) -> None:
    """Say once, at start-up, that the tenants' weights do nothing under this fairness."""
    with contextlib.suppress(Exception):  # Redis away: the API starts all the same
        async with asyncio.timeout(2):
            warning = unused_weights(fairness, await TenantStore(redis).all())
            if warning:
                log.warning("%s", warning)


async def _heartbeat(queue: Queue, settings: ApiSettings, process_id: str) -> NoReturn:
    """Keep this process's liveness lease, which its attached requests depend on."""
    await run_periodically(
        lambda: queue.api_beat(process_id, settings.orphan_grace_seconds),
        settings.heartbeat_seconds,
        what="API heartbeat",
        logger=log,
    )


#: FastAPI's own OpenTelemetry server span (FastAPI >= 0.16x, on whenever a tracer
#: provider is set) off: ``llmq.request`` (:mod:`api.traced`) is the request's span,
#: and FastAPI's marked every streamed answer failed (its end as a disconnect).
_NO_NATIVE_TRACING: dict[str, Any] = (
    {"telemetry": {"tracing": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters
    else {}
)

#: The header a draining process adds to each response.
CLOSE = (b"connection", b"close")


class _App(FastAPI):
    """FastAPI that hands the server's own ``send`` to the streaming responses.

    A stream's chunks then skip the middleware wrappers around ``send``, which only
    watch a response's start (see :class:`api.streams.event_stream.EventStream`). Every
    response but a probe's or a scrape's is counted by its status class
    (``llmq_http_responses_total``); while the process drains
    (:attr:`AppState.draining`), every response says ``Connection: close``.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope[event_stream.SERVER_SEND] = send
        state: AppState | None = getattr(self.state, "llmq", None)
        if state is not None and scope["type"] == "http" and scope["path"] not in UNTRACED:
            send = _counted(send, state.metrics)
        if state is not None and state.draining.is_set() and scope["type"] == "http":
            send = _closing(send)
        await super().__call__(scope, receive, send)


#: ``llmq_http_responses_total``'s class of each status hundred.
_CODE_CLASSES = {n: f"{n}xx" for n in range(1, 6)}


def _counted(send: Send, tally: Tally) -> Send:
    """``send`` that counts the response by its status class at its start: once per
    response, outside every middleware (a 500 of an unhandled error included); a
    stream's chunks skip it (:data:`event_stream.SERVER_SEND`)."""

    async def counted(message: Message) -> None:
        if message["type"] == "http.response.start":
            code_class = _CODE_CLASSES.get(message["status"] // 100, "other")
            tally.inc(metrics.HTTP_RESPONSES, code_class)
        await send(message)

    return counted


def _closing(send: Send) -> Send:
    """``send`` with ``Connection: close`` added to the response's start."""

    async def closing(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), CLOSE]}
        await send(message)

    return closing


def _upload_bytes(app: FastAPI) -> int:
    """The pool policy's largest batch file (its default until the policy is read)."""
    state: AppState | None = getattr(app.state, "llmq", None)
    policy = DEFAULT if state is None else state.policy.pool()
    return policy.batch_max_file_bytes


def create_app(settings: ApiSettings) -> FastAPI:
    process_id = f"api-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        redis = connect(settings)
        # The relay's XREAD blocks: it gets its own connection, with a socket timeout
        # longer than the block time.
        blocking: Redis | None = None
        relay: StreamRelay | GroupedRelay
        if is_cluster(settings):  # a reader per slot (api/streams/grouped_relay.py)
            relay = GroupedRelay(settings, cast(RedisCluster, redis), process_id)
        else:
            blocking = connect(
                settings, max_connections=2, socket_timeout=settings.relay_block_ms / 1000 + 5
            )
            relay = StreamRelay(
                blocking, keys.control(process_id), block_ms=settings.relay_block_ms
            )
        tally = metrics.Tally()
        policy = await live_policy.start(redis, settings, process_id, derived=True)
        state = AppState(
            settings=settings,
            process_id=process_id,
            redis=redis,
            relay=relay,
            catalog=Catalog(redis, settings.worker_ttl_seconds),
            queue=Queue(
                redis,
                stream_maxlen=settings.stream_maxlen,
                ttl_seconds=settings.request_ttl_seconds,
                tally=tally,
                lifecycle_maxlen=settings.lifecycle_maxlen,
                policy=policy,
            ),
            accept_models=frozenset(m.strip() for m in settings.accept_models.split(",") if m),
            api_keys=frozenset(k.strip() for k in settings.api_keys.split(",") if k.strip()),
            tenancy=Tenancy(TenantStore(redis), lambda: policy.pool().default_tenant),
            policy=policy,
            metrics=tally,
        )
        if settings.tenants_file:
            await load_file(TenantStore(redis), settings.tenants_file)
        await _warn_unused_weights(redis, policy.pool().fairness)
        await relay.start()
        # The first beat before serving, so the process is known before it attaches requests.
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2):
                await state.queue.api_beat(process_id, settings.orphan_grace_seconds)
        feeder = BatchFeeder(state)
        tasks = [
            asyncio.create_task(sweep_forever(state.queue, settings.sweep_seconds)),
            asyncio.create_task(metrics.flush_forever(state.metrics, redis)),
            asyncio.create_task(_heartbeat(state.queue, settings, process_id)),
            asyncio.create_task(state.catalog.refresh_forever()),
            asyncio.create_task(feeder.run_forever()),
            asyncio.create_task(policy.follow_forever()),
        ]
        app.state.llmq = state
        app.state.batch_feeder = feeder  # handed over first when the process stops (api/main.py)
        try:
            yield
        finally:
            await feeder.hand_over()
            await stop_tasks(tasks, timeout=5)
            # disconnect-triggered cancels are short Redis calls: let them finish
            if state.background:
                await asyncio.wait(state.background, timeout=5)
            await stop_tasks(state.background, timeout=2)
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):
                    await state.queue.api_gone(process_id)
            await metrics.final_flush(state.metrics, redis)
            await relay.stop()
            await state.rendering.aclose()
            if blocking is not None:
                await blocking.aclose(close_connection_pool=True)
            await redis.aclose(close_connection_pool=True)

    app = _App(
        title="llmq",
        version=__version__,
        description="Queue-based LLM serving: OpenAI-compatible and native APIs.",
        lifespan=lifespan,
        **_NO_NATIVE_TRACING,
    )
    errors.install(app)
    openapi.install(app)
    app.include_router(openai.generation)
    app.include_router(openai.router)
    app.include_router(responses.generation)
    app.include_router(responses.router)
    app.include_router(embeddings.router)
    app.include_router(files.router)
    app.include_router(batches.router)
    app.include_router(native.generation)
    app.include_router(native.router)
    app.include_router(health.router)
    app.include_router(metrics_routes.router)
    admin_routes.install(app)
    app.add_middleware(RateLimitHeaders)
    app.add_middleware(
        BodyLimit, max_bytes=settings.max_body_bytes, upload_bytes=lambda: _upload_bytes(app)
    )
    if tracing.enabled():  # outermost: its span is current for everything below it
        app.add_middleware(TraceRequests)
    return app
