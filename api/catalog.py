"""Which models are served right now, from the worker registry, kept fresh off the
request path.

Every request names a model; checking it must not cost a Redis round trip per
request, nor one every time a cache expires (at light load that would be most
requests). :meth:`Catalog.refresh_forever` re-reads the registry every
``max_age`` seconds in the background. A model missing from the cache triggers
one refresh before it is refused, so a worker that just started is found at once;
if the background refresh stalls (Redis away), reads refresh inline again.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from llmq import registry
from llmq.model.tokenizer import CHARS, TOKENIZERS, WHITESPACE, Tokenizer
from llmq.schema import WorkerInfo
from llmq.tasks import run_periodically

log = logging.getLogger(__name__)

#: A model missing from the cache is looked up again at most this often.
MISS_REFRESH_SECONDS = 0.05


@dataclass(frozen=True)
class Declaration:
    """How a model's workers declare it: the tokenizer the API counts its prompts with
    (the mock's whitespace when no worker says; ``chars`` when they disagree or name
    one the API lacks) and the shortest context length among them (None: unknown)."""

    tokenizer: Tokenizer = WHITESPACE
    context_length: int | None = None


class Catalog:
    def __init__(self, redis: Redis, worker_ttl: float, max_age: float = 1.0) -> None:
        self._redis = redis
        self._worker_ttl = worker_ttl
        self._max_age = max_age
        self._models: frozenset[str] = frozenset()
        self._workers: list[WorkerInfo] = []
        self._fetched = 0.0

    async def workers(self) -> list[WorkerInfo]:
        workers = await registry.live_workers(self._redis, self._worker_ttl)
        self._models = frozenset(w.model for w in workers)
        self._workers = workers
        self._fetched = time.monotonic()
        return workers

    async def capabilities(self, model: str) -> frozenset[str] | None:
        """What every live worker of ``model`` declares it honours (None: no live worker).

        The intersection: a request may be claimed by any of them.
        """
        await self.models()
        declared = [frozenset(w.capabilities or ()) for w in self._workers if w.model == model]
        return frozenset.intersection(*declared) if declared else None

    async def declaration(self, model: str) -> Declaration:
        await self.models()
        workers = [w for w in self._workers if w.model == model]
        if not workers:
            return Declaration()
        names = {w.tokenizer or WHITESPACE.name for w in workers}
        name = names.pop() if len(names) == 1 else CHARS.name
        lengths = [w.context_length for w in workers if w.context_length]
        return Declaration(TOKENIZERS.get(name, CHARS), min(lengths) if lengths else None)

    async def renderer(self, model: str) -> dict[str, Any] | None:
        """Where an engine of ``model`` renders chat messages with the model's template
        (a live worker's upstream ``render``, a ready one first); None: none does."""
        await self.models()
        workers = sorted((w for w in self._workers if w.model == model), key=lambda w: not w.ready)
        found = [(w.upstream or {}).get("render") for w in workers]
        return next((r for r in found if isinstance(r, dict) and r.get("url")), None)

    async def refresh_forever(self) -> None:
        """Keep the cache younger than ``max_age`` (twice a period, so reads never wait)."""
        await run_periodically(
            self.workers, self._max_age / 2, what="worker registry refresh", logger=log
        )

    async def models(self) -> frozenset[str]:
        if time.monotonic() - self._fetched > self._max_age:
            await self.workers()
        return self._models

    async def is_served(self, model: str) -> bool:
        if model in await self.models():
            return True
        if time.monotonic() - self._fetched > MISS_REFRESH_SECONDS:
            await self.workers()
        return model in self._models
