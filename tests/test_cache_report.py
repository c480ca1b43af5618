"""A worker's cache report: what the backend hears adds up, and what reaches Redis."""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import cast

import pytest
from redis.asyncio import Redis

from llmq.model.interface import CacheListener
from llmq.protocol import keys
from llmq.protocol.queue import Queue
from llmq.protocol.routing import POLICIES, Routing
from worker.cache_report import CacheReport

pytestmark = pytest.mark.timeout(30)


class Reporting:
    """A backend that reports its cache (the smallest conforming one)."""

    def __init__(self) -> None:
        self.listeners: list[CacheListener] = []

    def watch_cache(self, listener: CacheListener) -> None:
        self.listeners.append(listener)

    def change(self, stored: Sequence[str], evicted: Sequence[str]) -> None:
        for listener in self.listeners:
            listener(stored, evicted)


async def published(redis: Redis) -> set[str]:
    return await cast("Awaitable[set[str]]", redis.smembers(keys.cache("w", "mock")))


async def test_each_beat_sends_what_changed_and_the_whole_cache_when_the_set_is_gone(
    redis: Redis,
) -> None:
    queue = Queue(redis, stream_maxlen=100, ttl_seconds=60, routing=Routing(POLICIES["prefix"]))
    backend = Reporting()
    report = CacheReport(backend)

    async def beat() -> None:
        await report.publish(queue, "mock", "w", running=0, capacity=4, ttl_ms=5000)

    backend.change(["a", "b", "c"], [])
    await beat()
    assert await published(redis) == {"a", "b", "c"}
    backend.change(["d"], ["a"])
    backend.change(["a"], ["d"])  # back and forth within one beat: the net change
    await beat()
    assert await published(redis) == {"a", "b", "c"}
    await redis.delete(keys.cache("w", "mock"))  # expired, or Redis lost it
    backend.change(["e"], [])
    await beat()
    assert await published(redis) == {"a", "b", "c", "e"}


async def test_a_backend_that_reports_nothing_publishes_only_its_load(redis: Redis) -> None:
    queue = Queue(redis, stream_maxlen=100, ttl_seconds=60, routing=Routing(POLICIES["prefix"]))
    report = CacheReport(object())
    await report.publish(queue, "mock", "w", running=2, capacity=4, ttl_ms=5000)
    assert await published(redis) == set()
    assert await redis.hget(keys.loads("mock"), "w") == "2|4|0|0"  # type: ignore[misc]
