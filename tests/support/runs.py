"""A request's run as the tests check it: what an undisturbed run of the mock
model produces, the job a worker is given, and what the run wrote to its stream."""

from __future__ import annotations

import time

from redis.asyncio import Redis

from llmq.model.interface import GenerationRequest
from llmq.protocol import keys
from llmq.schema import Event, JobPayload, SamplingParams, decode_event
from worker.mock import MockBackend


async def undisturbed(max_tokens: int, seed: int) -> list[str]:
    """The mock model's tokens for ``seed``: what a run without failures produces."""
    model = MockBackend(tokens_per_second=1e9, prefill_seconds_per_token=0.0)
    request = GenerationRequest(prompt="p", max_tokens=max_tokens, seed=seed, prompt_tokens=0)
    return [token async for token in model.generate(request) if isinstance(token, str)]


async def stream_events(redis: Redis, rid: str) -> list[tuple[float, Event]]:
    """The request's stream as (written at, Unix s; event)."""
    out: list[tuple[float, Event]] = []
    for entry_id, fields in await redis.xrange(keys.stream(rid)):
        event = decode_event(fields)
        assert event is not None, fields
        out.append((int(str(entry_id).split("-")[0]) / 1000, event))
    return out


def payload(rid: str, max_tokens: int, seed: int) -> JobPayload:
    now = time.time()
    return JobPayload(
        request_id=rid,
        model="mock",
        prompt="p",
        prompt_tokens=1,
        params=SamplingParams(max_tokens=max_tokens, seed=seed),
        enqueued_at=now,
        queue_deadline=now + 60,
        generation_timeout=30,
    )
