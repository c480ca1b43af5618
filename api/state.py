"""The resources of one API process, created and closed by the app's lifespan."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Request
from redis.asyncio import Redis

from api.admission.tenancy import Tenancy
from api.catalog import Catalog
from api.chat_render import ChatRendering
from api.streams.grouped_relay import GroupedRelay
from api.streams.relay import StreamRelay
from api.streams.subscription import Subscription
from llmq.metrics import Tally
from llmq.policy.live import LivePolicy
from llmq.protocol.queue import Queue
from llmq.settings import ApiSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AppState:
    settings: ApiSettings
    process_id: str
    redis: Redis
    relay: StreamRelay | GroupedRelay
    catalog: Catalog
    queue: Queue
    accept_models: frozenset[str]
    #: Key and tenant lookups (:mod:`api.admission.tenancy`).
    tenancy: Tenancy
    #: The pool policy per model, followed live (:mod:`llmq.policy`).
    policy: LivePolicy
    api_keys: frozenset[str] = frozenset()
    #: Chat messages as the model's engine renders them, for routing (:mod:`api.chat_render`).
    rendering: ChatRendering = field(default_factory=ChatRendering)
    background: set[asyncio.Task[Any]] = field(default_factory=set)
    #: This process's not-yet-flushed metrics (see :mod:`llmq.metrics`).
    metrics: Tally = field(default_factory=Tally)
    #: The subscriptions of the streams being relayed, ended cleanly at shutdown.
    following: set[Subscription] = field(default_factory=set)
    #: Set on SIGTERM (:mod:`api.main`): readiness fails and every response closes its
    #: connection, so that clients move to another process before this one stops.
    draining: asyncio.Event = field(default_factory=asyncio.Event)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` detached from the request (e.g. a cancel after a disconnect).

        The task is owned here and awaited at shutdown, so it is never lost.
        """
        task = asyncio.create_task(coro)
        self.background.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self.background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("background task failed: %s", task.exception())


def state_of(request: Request) -> AppState:
    """The process's state, read directly: the generation routes, on the latency path,
    skip a dependency for it (each one costs FastAPI a resolution step per request)."""
    state: AppState = request.app.state.llmq
    return state


async def get_state(request: Request) -> AppState:
    """Async on purpose: FastAPI runs a sync dependency in a thread pool, a thread
    hop per request that costs about a millisecond."""
    return state_of(request)


#: The process's state as a FastAPI dependency.
State = Annotated[AppState, Depends(get_state)]
