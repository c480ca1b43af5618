"""Writing events to request streams and records, from any process.

Workers write through their batching publisher; the API and the deadline sweep
write the terminal event of a request that never reached a worker (cancelled or
timed out while queued). Both use these helpers so that every written stream
gets its TTL and stays capped.
"""

from __future__ import annotations

import time
from typing import Any

from redis.asyncio.client import Pipeline

from llmq import keys
from llmq.schema import DoneEvent, ErrorEvent, Event, Lifecycle, Timings, Usage, encode_event


def add_event(pipe: Pipeline, request_id: str, event: Event, *, maxlen: int, ttl: int) -> None:
    """Queue an XADD on ``pipe``; every non-token event also (re)sets the TTL."""
    stream = keys.stream(request_id)
    fields: dict[Any, Any] = encode_event(event)
    pipe.xadd(stream, fields, maxlen=maxlen, approximate=True)
    if event.type != "tokens":
        pipe.expire(stream, ttl)


def add_lifecycle(pipe: Pipeline, note: Lifecycle, *, maxlen: int) -> None:
    fields: dict[Any, Any] = note.fields()
    pipe.xadd(keys.LIFECYCLE, fields, maxlen=maxlen, approximate=True)


def add_record(pipe: Pipeline, request_id: str, fields: dict[str, str], *, ttl: int) -> None:
    pipe.hset(keys.request(request_id), mapping=fields)
    pipe.expire(keys.request(request_id), ttl)


def unstarted_end(
    request_id: str, reason: str, *, queued_since: float | None, prompt_tokens: int = 0
) -> tuple[Event, dict[str, str]]:
    """The terminal event and record fields of a request that never started."""
    now = time.time()
    queue_ms = round((now - queued_since) * 1000, 3) if queued_since else 0.0
    usage = Usage(prompt_tokens=prompt_tokens, completion_tokens=0, total_tokens=prompt_tokens)
    event: Event
    if reason == "cancelled":
        event = DoneEvent(
            finish_reason="cancelled",
            usage=usage,
            timings=Timings(queue_ms=queue_ms, prefill_ms=0, decode_ms=0),
        )
        status = "cancelled"
    else:
        event = ErrorEvent(
            code="queue_timeout",
            message="the request waited in the queue past its deadline and was not run",
            finish_reason="timeout",
            usage=usage,
        )
        status = "failed"
    record = {
        "status": status,
        "finished_at": str(now),
        "finish_reason": event.finish_reason,
        "completion_tokens": "0",
    }
    if isinstance(event, ErrorEvent):
        record["error"] = event.message
    return event, record
