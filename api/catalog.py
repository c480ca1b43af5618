"""Which models are served right now, from the worker registry, briefly cached.

Every request names a model; checking it must not cost a Redis round trip per
request, so the set of live models is cached for ``max_age`` seconds. A model
missing from the cache triggers one refresh before it is refused, so a worker
that just started is found at once.
"""

from __future__ import annotations

import time

from redis.asyncio import Redis

from llmq import registry
from llmq.schema import WorkerInfo


class Catalog:
    def __init__(self, redis: Redis, worker_ttl: float, max_age: float = 1.0) -> None:
        self._redis = redis
        self._worker_ttl = worker_ttl
        self._max_age = max_age
        self._models: frozenset[str] = frozenset()
        self._fetched = 0.0

    async def workers(self) -> list[WorkerInfo]:
        workers = await registry.live_workers(self._redis, self._worker_ttl)
        self._models = frozenset(w.model for w in workers)
        self._fetched = time.monotonic()
        return workers

    async def models(self) -> frozenset[str]:
        if time.monotonic() - self._fetched > self._max_age:
            await self.workers()
        return self._models

    async def is_served(self, model: str) -> bool:
        if model in await self.models():
            return True
        if time.monotonic() - self._fetched > 0.05:
            await self.workers()
        return model in self._models
