"""A request ended in the queue reports the tokens its stream holds: zero if it never
ran, else what an earlier run published before it was requeued (its worker died,
then its client cancelled while it waited for a re-run)."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from llmq.protocol import keys, streams
from llmq.protocol.queue import Queue
from llmq.schema import DoneEvent, TokensEvent, decode_event

pytestmark = pytest.mark.timeout(30)


async def _seed(redis: Redis, rid: str, *, started: bool, tokens: list[str]) -> None:
    write = redis.pipeline(transaction=False)
    record = {"created_at": "1.0", "prompt_tokens": "4", "model": "mock"}
    if started:
        record["started_at"] = "2.0"
    streams.add_record(write, rid, record, ttl=60)
    if tokens:
        streams.add_event(write, rid, TokensEvent(index=0, tokens=tokens), maxlen=100, ttl=60)
    await write.execute()


async def _end(redis: Redis, rid: str) -> tuple[DoneEvent, dict[str, str]]:
    queue = Queue(redis, stream_maxlen=100, ttl_seconds=60)
    await queue.end_unstarted([rid], "cancelled")
    entries = await redis.xrange(keys.stream(rid))
    event = decode_event(entries[-1][1])
    assert isinstance(event, DoneEvent)
    record = {str(k): str(v) for k, v in (await redis.hgetall(keys.request(rid))).items()}  # type: ignore[misc]
    return event, record


async def test_a_requeued_request_cancelled_in_the_queue_counts_what_its_run_published(
    redis: Redis,
) -> None:
    await _seed(redis, "r", started=True, tokens=["a", " b", " c"])
    event, record = await _end(redis, "r")
    assert event.finish_reason == "cancelled"
    assert event.usage.completion_tokens == 3 and event.usage.total_tokens == 7
    assert record["completion_tokens"] == "3" and record["status"] == "cancelled"


async def test_a_request_that_never_ran_counts_none(redis: Redis) -> None:
    await _seed(redis, "q", started=False, tokens=[])
    event, record = await _end(redis, "q")
    assert event.usage.completion_tokens == 0 and record["completion_tokens"] == "0"
