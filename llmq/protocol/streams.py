"""Writing events to request streams and records, from any process.

Workers write through their batching publisher and its fenced script
(``llmq/protocol/lua/publish.lua``); the API and the deadline sweep write the terminal event
of a request that never reached a worker (cancelled or timed out while queued) with
these helpers, so that every written stream gets its TTL and stays capped.
:func:`published_tokens` reads back what a stream already holds, so that a re-run
can resume after it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.commands.core import AsyncScript

from llmq.protocol import codec, keys
from llmq.protocol.scripts import scripts_for
from llmq.schema import (
    DoneEvent,
    ErrorEvent,
    Event,
    Lifecycle,
    Timings,
    TokensEvent,
    Usage,
    decode_event,
    encode_event,
    is_terminal,
)


class Lifetimes(Protocol):
    """How long a request's keys live and how far the streams a process writes grow:
    pool-wide keys of the pool policy (:class:`llmq.policy.model.Policy` is one), read
    at each write so that a change applies without a restart."""

    @property
    def request_ttl_seconds(self) -> int: ...

    @property
    def stream_maxlen(self) -> int: ...

    @property
    def lifecycle_maxlen(self) -> int: ...


def add_event(pipe: Pipeline, request_id: str, event: Event, *, maxlen: int, ttl: int) -> None:
    """Queue an XADD on ``pipe``; every non-token event also (re)sets the TTL."""
    stream = keys.stream(request_id)
    fields: dict[Any, Any] = encode_event(event)
    pipe.xadd(stream, fields, maxlen=maxlen, approximate=True)
    if event.type != "tokens":
        pipe.expire(stream, ttl)


def add_lifecycle(pipe: Pipeline, note: Lifecycle, *, maxlen: int) -> None:
    """Queue an XADD of ``note`` to the lifecycle stream of its request's group."""
    fields: dict[Any, Any] = note.fields()
    pipe.xadd(keys.lifecycle(note.request_id), fields, maxlen=maxlen, approximate=True)


async def lifecycle_entries(redis: Redis) -> list[tuple[str, dict[str, str]]]:
    """Every entry of every lifecycle stream (one per request group), in entry id
    order: the order they were written in, to the millisecond."""
    pipe = redis.pipeline(transaction=False)
    for key in keys.LIFECYCLES:
        pipe.xrange(key)
    entries = [
        (codec.as_str(entry_id), {codec.as_str(k): codec.as_str(v) for k, v in fields.items()})
        for found in await pipe.execute()
        for entry_id, fields in found
    ]
    return sorted(entries, key=lambda e: tuple(int(x) for x in e[0].split("-")))


def add_record(pipe: Pipeline, request_id: str, fields: dict[str, str], *, ttl: int) -> None:
    pipe.hset(keys.request(request_id), mapping=fields)
    pipe.expire(keys.request(request_id), ttl)


async def published_tokens(redis: Redis, request_id: str) -> list[str]:
    """The token texts in the request's stream, contiguous from index 0.

    One ``XRANGE`` of the whole stream (capped by ``stream_maxlen``); see
    :func:`contiguous_tokens` for how its events are merged.
    """
    entries = await redis.xrange(keys.stream(request_id))
    return contiguous_tokens(decode_event(fields) for _, fields in entries)


async def final_event_id(redis: Redis, request_id: str) -> str | None:
    """The id of the request's final event (``done``, ``error``...) if its stream
    ends with one: nothing follows it, so a reader already past it has everything."""
    entries = await redis.xrevrange(keys.stream(request_id), count=1)
    if not entries:
        return None
    entry_id, fields = entries[0]
    event = decode_event(fields)
    return codec.as_str(entry_id) if event is not None and is_terminal(event) else None


def contiguous_tokens(events: Iterable[Event | None]) -> list[str]:
    """The tokens of ``tokens`` events, in stream order, from index 0 up to the first gap.

    Other events and ``None`` (malformed entries) are skipped. Overlapping events
    (tokens written by more than one run) are merged as a reader's cursor does: the
    first text written for an index wins. The scan stops at an event that starts
    beyond the tokens gathered so far (the stream was trimmed, or a write was lost).
    """
    tokens: list[str] = []
    for event in events:
        if not isinstance(event, TokensEvent):
            continue
        if event.index > len(tokens):
            break
        tokens.extend(event.tokens[len(tokens) - event.index :])
    return tokens


def unstarted_end(
    request_id: str,
    reason: str,
    *,
    queued_since: float | None,
    prompt_tokens: int = 0,
    completion_tokens: int = 0,
) -> tuple[Event, dict[str, str]]:
    """The terminal event and record fields of a request ended in the queue: one that
    never started, or one requeued after a run that published ``completion_tokens``
    (its usage counts what its stream holds)."""
    now = time.time()
    queue_ms = round((now - queued_since) * 1000, 3) if queued_since else 0.0
    usage = Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
    )
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
        "completion_tokens": str(completion_tokens),
    }
    if isinstance(event, ErrorEvent):
        record["error"] = event.message
    return event, record


def publish_script(redis: Redis) -> AsyncScript:
    """The fenced writes of runs, many per call (``llmq/protocol/lua/publish.lua``),
    registered with ``redis``: its ``sha`` goes in :func:`publish_calls`, its text is
    loaded again after a Redis restart emptied the script cache."""
    return scripts_for(redis).publish


class RunWrites(Protocol):
    """What one flush writes for one request: the attempt that writes, its events,
    record fields and lifecycle notes."""

    @property
    def attempt(self) -> int: ...

    @property
    def events(self) -> Sequence[Event]: ...

    @property
    def record(self) -> Mapping[str, str]: ...

    @property
    def notes(self) -> Sequence[Lifecycle]: ...


#: The most requests one ``publish.lua`` call writes. A flush of more goes as
#: several calls in the same round trip, so that no one script holds Redis for long
#: (a flush after an outage carries every running request's backlog).
MAX_WRITES_PER_CALL = 64

#: One ``EVALSHA`` of ``publish.lua`` and the requests it writes, in the order
#: of its reply.
PublishCall = tuple[tuple[Any, ...], list[str]]


def publish_calls(
    sha: str,
    writes: Mapping[str, RunWrites],
    *,
    ttl: int,
    maxlen: int,
    lifecycle_maxlen: int,
    by_slot: bool,
) -> list[PublishCall]:
    """The writes of many runs (request id -> its writes) as ``EVALSHA`` commands of
    ``publish.lua``, each with the requests it carries. On a single Redis one
    call carries up to :data:`MAX_WRITES_PER_CALL` requests, whatever their slots;
    with ``by_slot`` (a Redis Cluster, where a call's keys must share a slot) a call
    carries the requests of one request group. Each request's keys (stream, record,
    fence, lifecycle: one slot, its group) and arguments (after their count) are
    :class:`llmq.protocol.slots.Publish`'s, written here in its order without building
    one: this runs per request per flush, nearly once per token, where a builder's
    construction and flattening cost a third of the call (``tests/test_slots.py``
    holds the order to the builder's). The worker's publisher sends a flush's calls in
    one round trip."""
    limits = (str(ttl), str(maxlen), str(lifecycle_maxlen))
    groups: dict[int, list[str]] = {}
    for request_id in writes:
        group = keys.request_group(request_id) if by_slot else 0
        groups.setdefault(group, []).append(request_id)
    calls: list[PublishCall] = []
    for ids in groups.values():
        for at in range(0, len(ids), MAX_WRITES_PER_CALL):
            chunk = ids[at : at + MAX_WRITES_PER_CALL]
            call_keys: list[str] = []
            argv: list[str] = []
            for request_id in chunk:
                w = writes[request_id]
                call_keys += keys.run_keys(request_id)
                count_at = len(argv)
                # The argument count (once they are in), then Publish's named ARGV.
                argv += ("", str(w.attempt), *limits)
                argv += (str(len(w.events)), str(len(w.record)), str(len(w.notes)))
                argv += codec.publish_writes(w.events, w.record, w.notes)
                argv[count_at] = str(len(argv) - count_at - 1)
            calls.append((("EVALSHA", sha, len(call_keys), *call_keys, *argv), chunk))
    return calls
