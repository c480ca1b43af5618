"""The runner starts the model before its bookkeeping, yet "started" still comes first."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from llmq.schema import DoneEvent, StartedEvent, TokensEvent
from tests.support.runs import payload, stream_events
from worker.model import GenerationRequest, count_tokens
from worker.publisher import StreamPublisher
from worker.runner import RequestRunner

pytestmark = pytest.mark.timeout(30)


class EagerModel:
    """A backend whose first tokens are ready before it ever awaits (a warm cache)."""

    def count_tokens(self, text: str) -> int:
        return count_tokens(text)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[str]:
        for i in range(request.max_tokens):
            yield f" t{i}"


async def test_started_precedes_tokens_a_model_yields_at_once(redis: Redis) -> None:
    publisher = StreamPublisher(redis, maxlen=100, ttl_seconds=60, max_event_tokens=1)
    publisher.start()
    runner = RequestRunner("w-test", EagerModel(), publisher)
    try:
        await runner.run(payload("eager", max_tokens=3, seed=1), attempt=1)
    finally:
        await publisher.stop()
    events = [e for _, e in await stream_events(redis, "eager")]
    assert isinstance(events[0], StartedEvent)
    assert [e.tokens for e in events[1:-1] if isinstance(e, TokensEvent)] == [
        [" t0"],
        [" t1"],
        [" t2"],
    ]
    assert isinstance(events[-1], DoneEvent) and events[-1].finish_reason == "length"
