"""The runner starts the model before its bookkeeping, yet "started" still comes first; a
backend with its own step loop hands tokens over by callback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from llmq.model.interface import Backend, Emit, GenerationRequest
from llmq.model.tokenizer import count_tokens
from llmq.schema import DoneEvent, Event, StartedEvent, TokensEvent
from tests.support.runs import payload, stream_events
from worker.publisher import StreamPublisher, _Pending
from worker.runner import UNDERWAY_TURNS, RequestRunner

pytestmark = pytest.mark.timeout(30)


class EagerModel:
    """A backend whose first tokens are ready before it ever awaits (a warm cache)."""

    def count_tokens(self, text: str) -> int:
        return count_tokens(text)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[str]:
        for i in range(request.max_tokens):
            yield f" t{i}"


async def run_one(
    redis: Redis,
    backend: Backend,
    rid: str,
    max_tokens: int,
    publisher: StreamPublisher | None = None,
) -> list[Event]:
    """Run one request on ``backend`` (one token per event); its stream's events."""
    publisher = publisher or StreamPublisher(redis, maxlen=100, ttl_seconds=60, max_event_tokens=1)
    publisher.start()
    runner = RequestRunner("w-test", backend, publisher)
    try:
        await runner.run(payload(rid, max_tokens=max_tokens, seed=1), attempt=1)
    finally:
        await publisher.stop()
    return [e for _, e in await stream_events(redis, rid)]


async def test_started_precedes_tokens_a_model_yields_at_once(redis: Redis) -> None:
    events = await run_one(redis, EagerModel(), "eager", 3)
    assert isinstance(events[0], StartedEvent)
    assert [e.tokens for e in events[1:-1] if isinstance(e, TokensEvent)] == [
        [" t0"],
        [" t1"],
        [" t2"],
    ]
    assert isinstance(events[-1], DoneEvent) and events[-1].finish_reason == "length"


class CallbackModel(EagerModel):
    """A backend with its own step loop: tokens come by callback; iterating is refused."""

    async def generate(self, request: GenerationRequest) -> AsyncIterator[str]:
        raise AssertionError("a stepped backend is not iterated")
        yield ""  # pragma: no cover

    async def generate_into(self, request: GenerationRequest, emit: Emit) -> None:
        for i in range(request.max_tokens):
            await asyncio.sleep(0)
            emit(f" s{i}")


async def test_a_stepped_backend_hands_its_tokens_over_by_callback(redis: Redis) -> None:
    events = await run_one(redis, CallbackModel(), "stepped", 4)
    tokens = [t for e in events if isinstance(e, TokensEvent) for t in e.tokens]
    assert tokens == [" s0", " s1", " s2", " s3"]
    assert isinstance(events[-1], DoneEvent) and events[-1].finish_reason == "length"


class SlowToSendModel(EagerModel):
    """A backend whose request leaves a turn after it is made, as an upstream request's
    body does with aiohttp on Python 3.11 (written by a task of its own)."""

    def __init__(self, order: list[str]) -> None:
        self.order = order

    async def generate(self, request: GenerationRequest) -> AsyncIterator[str]:
        for _ in range(UNDERWAY_TURNS - 1):
            await asyncio.sleep(0)
        self.order.append("request sent")
        async for token in super().generate(request):
            yield token


class OrderedPublisher(StreamPublisher):
    """Notes each round trip to Redis in ``order``."""

    def __init__(self, redis: Redis, order: list[str]) -> None:
        super().__init__(redis, maxlen=100, ttl_seconds=60, max_event_tokens=1)
        self.order = order

    async def _round_trip(self, batch: dict[str, _Pending]) -> dict[str, bool]:
        self.order.append("write")
        return await super()._round_trip(batch)


async def test_the_model_sends_its_request_before_the_run_writes_started(redis: Redis) -> None:
    order: list[str] = []
    events = await run_one(
        redis, SlowToSendModel(order), "slow-send", 2, OrderedPublisher(redis, order)
    )
    assert order[:2] == ["request sent", "write"]
    assert isinstance(events[0], StartedEvent)  # still the stream's first event
    tokens = [t for e in events if isinstance(e, TokensEvent) for t in e.tokens]
    assert tokens == [" t0", " t1"]
