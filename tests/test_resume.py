"""A re-run resumes after the tokens already published instead of generating them again.

Whether its worker was SIGKILLed (the lease reaper requeues the request) or its
model raised (arq retries it), the next run reads the request's stream, passes the
tokens there to the model as ``generated`` and publishes from the next index: the
stream holds each token once, and the client's text is the undisturbed run's.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from llmq.embedded import free_port
from llmq.model.interface import GenerationRequest, Output
from llmq.model.tokenizer import count_tokens
from llmq.protocol import keys
from llmq.protocol.streams import contiguous_tokens, published_tokens
from llmq.schema import (
    DoneEvent,
    ErrorEvent,
    Event,
    StartedEvent,
    Timings,
    TokensEvent,
    Usage,
)
from tests.support.cluster import BOTH_BACKENDS
from tests.support.native import record, wait_ready
from tests.support.runs import payload, stream_events, undisturbed
from tests.support.servers import FAST_MODEL, SpawnWorkers, StartApi, StartWorker
from tests.support.sse import frames, openai_chunks
from worker.mock import MockBackend
from worker.publisher import StreamPublisher
from worker.runner import RequestRunner

pytestmark = pytest.mark.timeout(90)


def split_at_rerun(
    events: list[tuple[float, Event]],
) -> tuple[list[TokensEvent], list[tuple[float, TokensEvent]]]:
    """Tokens events before the second ``started``; those after it, with when written."""
    starts = [i for i, (_, e) in enumerate(events) if isinstance(e, StartedEvent)]
    assert len(starts) == 2, f"expected two runs, got {len(starts)} started events"
    cut = starts[1]
    before = [e for _, e in events[:cut] if isinstance(e, TokensEvent)]
    after = [(at, e) for at, e in events[cut:] if isinstance(e, TokensEvent)]
    return before, after


def assert_resumed(before: list[TokensEvent], after: list[TokensEvent], expected: list[str]) -> int:
    """The re-run published from the index after the last one before it; returns that index."""
    assert before and after
    sent_before = max(e.index + len(e.tokens) for e in before)
    assert 0 < sent_before < len(expected)
    assert after[0].index == sent_before, "the re-run did not resume after the published tokens"
    assert min(e.index for e in after) == sent_before, "the re-run published an old index"
    # each token is in the stream exactly once, in order
    written = [t for e in before + after for t in e.tokens]
    assert written == expected
    return sent_before


# -- a worker SIGKILLed mid-stream ---------------------------------------------------------


@pytest.mark.slow
async def test_rerun_after_a_killed_worker_resumes_after_the_published_tokens(
    start_api: StartApi, spawn_workers: SpawnWorkers, redis: Redis
) -> None:
    max_tokens, seed, tps = 160, 23, 50
    expected = await undisturbed(max_tokens, seed)
    procs = await spawn_workers(2, concurrency=1, model_tokens_per_second=tps, lease_seconds=1)
    api = await start_api()
    body = {
        "model": "mock",
        "prompt": "resume me",
        "max_tokens": max_tokens,
        "seed": seed,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    text, rid, usage, finish = "", "", None, None
    victim_worker = ""
    async with api.client() as client:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            async for frame in frames(r):
                if frame.data == "[DONE]":
                    break
                chunk = frame.json()
                assert "error" not in chunk, chunk
                rid = chunk["id"].split("-", 1)[1]
                usage = chunk.get("usage") or usage
                for choice in chunk["choices"]:
                    text += choice.get("text") or ""
                    finish = choice.get("finish_reason") or finish
                if not victim_worker and len(text.split()) >= 80:
                    victim_worker = (await record(client, rid))["worker"]
                    victim = next(p for p in procs if f"-{p.pid}-" in victim_worker)
                    victim.signal(signal.SIGKILL)
        final = await record(client, rid)
    assert victim_worker, "the worker was never killed"
    assert text == "".join(expected), "tokens lost or repeated"
    assert usage is not None and usage["completion_tokens"] == max_tokens
    assert finish == "length"
    assert final["attempts"] == 2 and final["status"] == "done"
    assert final["worker"] != victim_worker
    assert final["completion_tokens"] == max_tokens

    events = await stream_events(redis, rid)
    before, after = split_at_rerun(events)
    sent_before = assert_resumed(before, [e for _, e in after], expected)
    assert sent_before >= 80
    # the first new token came after a prefill, not after generating sent_before
    # tokens again at model speed (which would take sent_before / tps seconds, 1.6 s
    # or more: no machine does that sooner, and a loaded one gets all of it as margin)
    rerun_at = next(at for at, e in events if isinstance(e, StartedEvent) and e.attempt == 2)
    assert after[0][0] - rerun_at < sent_before / tps
    done = events[-1][1]
    assert isinstance(done, DoneEvent)
    assert done.usage.completion_tokens == max_tokens and done.finish_reason == "length"
    # one first_token note: the resumed run's first token is not the client's first
    notes = await redis.xrange(keys.lifecycle(rid))
    first_tokens = [f for _, f in notes if f["request_id"] == rid and f["event"] == "first_token"]
    assert len(first_tokens) == 1


# -- a model that raised, retried by arq ---------------------------------------------------


class FailsOnce:
    """Raises at token index ``fail_at`` on a request's first run (a transient device loss).

    ``resumed`` records ``len(request.generated)`` of each run, in order.
    """

    def __init__(self, fail_at: int) -> None:
        self.inner = MockBackend(tokens_per_second=1000)
        self.fail_at = fail_at
        self.resumed: list[int] = []

    def count_tokens(self, text: str) -> int:
        return count_tokens(text)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Output]:
        first_run = not self.resumed
        self.resumed.append(len(request.generated))
        index = len(request.generated)
        async for token in self.inner.generate(request):
            if first_run and index == self.fail_at:
                raise RuntimeError("device lost")
            index += 1
            yield token


@BOTH_BACKENDS
async def test_rerun_after_a_model_error_resumes_after_the_published_tokens(
    start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    max_tokens, seed, fail_at = 60, 8, 25
    expected = await undisturbed(max_tokens, seed)
    model = FailsOnce(fail_at)
    await start_worker(backend=model)
    api = await start_api()
    async with api.client() as client:
        await wait_ready(client)
        body = {
            "model": "mock",
            "prompt": "hiccup",
            "max_tokens": max_tokens,
            "seed": seed,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        async with client.stream("POST", "/v1/completions", json=body) as r:
            chunks = await openai_chunks(r)
        rid = chunks[0]["id"].split("-", 1)[1]
        final = await record(client, rid)
    assert all("error" not in c for c in chunks), chunks[-1]
    text = "".join(c["choices"][0]["text"] for c in chunks if c.get("choices"))
    assert text == "".join(expected)
    usage = next(c["usage"] for c in chunks if c.get("usage"))
    assert usage["completion_tokens"] == max_tokens
    assert final["attempts"] == 2 and final["completion_tokens"] == max_tokens
    # the retry ran in the same process: every token the failed run produced was
    # still flushed before the re-run read the stream, so none was generated twice
    assert model.resumed == [0, fail_at]
    events = await stream_events(redis, rid)
    before, after = split_at_rerun(events)
    assert assert_resumed(before, [e for _, e in after], expected) == fail_at


# -- the runner on its own: what it reads, and when it does not ---------------------------


class CountingRedis:
    """Passes ``xrange`` through to a real client and counts the calls."""

    def __init__(self, redis: Redis, fail: bool = False) -> None:
        self.redis = redis
        self.fail = fail
        self.calls = 0

    async def xrange(self, name: str) -> Any:
        self.calls += 1
        if self.fail:
            raise ConnectionError("redis is away")
        return await self.redis.xrange(name)

    async def xrevrange(self, name: str, count: int) -> Any:
        if self.fail:
            raise ConnectionError("redis is away")
        return await self.redis.xrevrange(name, count=count)


async def run_once(
    redis: Redis,
    rid: str,
    attempt: int,
    reader: CountingRedis,
    max_tokens: int = 30,
    queued: list[str] | None = None,
) -> list[Event]:
    """Run the request once on a fresh runner; ``queued`` tokens are left in its
    publisher first, unwritten, as an earlier attempt in this process may leave them."""
    publisher = StreamPublisher(redis, maxlen=1000, ttl_seconds=60, max_event_tokens=4)
    for i, token in enumerate(queued or []):
        publisher.token(rid, i, token)
    publisher.start()
    runner = RequestRunner(
        "w-test",
        MockBackend(tokens_per_second=FAST_MODEL["model_tokens_per_second"] * 10),
        publisher,
        redis=cast(Redis, reader),
    )
    try:
        await runner.run(payload(rid, max_tokens, seed=5), attempt=attempt)
    finally:
        await publisher.stop()
    return [e for _, e in await stream_events(redis, rid)]


async def seed_stream(redis: Redis, rid: str, events: list[Event]) -> None:
    publisher = StreamPublisher(redis, maxlen=1000, ttl_seconds=60, max_event_tokens=256)
    publisher.start()
    try:
        for event in events:
            await publisher.emit(rid, event)
    finally:
        await publisher.stop()


async def test_a_first_run_does_not_read_the_stream(redis: Redis) -> None:
    expected = await undisturbed(30, seed=5)
    # tokens already there (they cannot be, on a first run) are not resumed after
    await seed_stream(redis, "r1", [TokensEvent(index=0, tokens=expected[:10])])
    reader = CountingRedis(redis)
    events = await run_once(redis, "r1", attempt=1, reader=reader)
    assert reader.calls == 0
    # the run produced from index 0; the write script skipped the indices the stream
    # already held, so each is there once
    tokens = [t for e in events if isinstance(e, TokensEvent) for t in e.tokens]
    assert tokens == expected


async def test_a_rerun_resumes_up_to_the_first_gap(redis: Redis) -> None:
    expected = await undisturbed(30, seed=5)
    await seed_stream(
        redis,
        "r2",
        [
            StartedEvent(worker="dead", attempt=1, queue_ms=1.0),
            TokensEvent(index=0, tokens=expected[:6]),
            TokensEvent(index=4, tokens=expected[4:9]),  # an overlap: merged
            TokensEvent(index=12, tokens=expected[12:15]),  # after a gap: not used
        ],
    )
    reader = CountingRedis(redis)
    events = await run_once(redis, "r2", attempt=2, reader=reader)
    assert reader.calls == 1
    rerun = events.index(next(e for e in events if isinstance(e, StartedEvent) and e.attempt == 2))
    new = [e for e in events[rerun:] if isinstance(e, TokensEvent)]
    assert new[0].index == 9
    assert expected[:9] + [t for e in new for t in e.tokens] == expected
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert done.usage.completion_tokens == 30 and done.finish_reason == "length"


async def test_a_rerun_sees_the_tokens_its_process_had_not_written_yet(redis: Redis) -> None:
    """A model error retried in the same process: the failed run's last tokens may still
    be queued in the publisher; the re-run reads the stream only once they are written."""
    expected = await undisturbed(30, seed=5)
    events = await run_once(
        redis, "r6", attempt=2, reader=CountingRedis(redis), queued=expected[:12]
    )
    rerun = events.index(next(e for e in events if isinstance(e, StartedEvent)))
    old = [e for e in events[:rerun] if isinstance(e, TokensEvent)]
    new = [e for e in events[rerun:] if isinstance(e, TokensEvent)]
    assert [t for e in old for t in e.tokens] == expected[:12]
    assert new[0].index == 12
    assert [t for e in old + new for t in e.tokens] == expected


async def test_a_rerun_that_cannot_read_the_stream_starts_over(
    redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    expected = await undisturbed(30, seed=5)
    await seed_stream(redis, "r3", [TokensEvent(index=0, tokens=expected[:10])])
    reader = CountingRedis(redis, fail=True)
    with caplog.at_level(logging.WARNING, logger="worker.runner"):
        events = await run_once(redis, "r3", attempt=2, reader=reader)
    assert reader.calls == 1
    assert "could not read its published tokens" in caplog.text
    # generated from 0 again; the write script kept each index once
    tokens = [t for e in events if isinstance(e, TokensEvent) for t in e.tokens]
    assert tokens == expected
    assert isinstance(events[-1], DoneEvent) and events[-1].usage.completion_tokens == 30


async def test_a_rerun_after_the_last_token_only_finishes(redis: Redis) -> None:
    """The dead run produced every token but not its terminal event: nothing is generated."""
    expected = await undisturbed(30, seed=5)
    await seed_stream(redis, "r4", [TokensEvent(index=0, tokens=expected)])
    events = await run_once(redis, "r4", attempt=2, reader=CountingRedis(redis))
    kinds: list[type] = [TokensEvent, StartedEvent, DoneEvent]
    assert [type(e) for e in events] == kinds
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert done.usage.completion_tokens == 30 and done.finish_reason == "length"


async def test_a_rerun_of_a_request_that_ended_writes_nothing(redis: Redis) -> None:
    """An earlier attempt wrote the end, then its worker stopped before its finish and
    was reaped: the re-run neither announces itself over the record nor ends it again."""
    expected = await undisturbed(30, seed=5)
    ended: list[Event] = [
        StartedEvent(worker="stopped", attempt=1, queue_ms=1.0),
        TokensEvent(index=0, tokens=expected),
        DoneEvent(
            finish_reason="length",
            usage=Usage(prompt_tokens=3, completion_tokens=30, total_tokens=33),
            timings=Timings(queue_ms=1.0, prefill_ms=1.0, decode_ms=1.0),
        ),
    ]
    await seed_stream(redis, "r7", ended)
    await redis.hset(keys.request("r7"), mapping={"status": "done"})  # type: ignore[misc]
    reader = CountingRedis(redis)
    events = await run_once(redis, "r7", attempt=2, reader=reader)
    assert reader.calls == 0
    assert events == ended
    assert await redis.hget(keys.request("r7"), "status") == "done"  # type: ignore[misc]


def test_contiguous_tokens_merges_overlaps_and_stops_at_a_gap() -> None:
    started = StartedEvent(worker="w", attempt=1, queue_ms=0)
    error = ErrorEvent(code="x", message="y")
    t = TokensEvent
    assert contiguous_tokens([]) == []
    assert contiguous_tokens([t(index=1, tokens=["b"])]) == []  # index 0 missing
    assert contiguous_tokens(
        [
            started,
            None,  # a malformed entry
            t(index=0, tokens=["a", "b"]),
            t(index=1, tokens=["X", "c"]),  # the first text of an index wins
            error,
            t(index=3, tokens=["d"]),
            t(index=5, tokens=["f"]),  # the gap at 4 ends the scan
            t(index=4, tokens=["e"]),
        ]
    ) == ["a", "b", "c", "d"]


async def test_published_tokens_reads_the_stream(redis: Redis) -> None:
    await seed_stream(
        redis, "r5", [TokensEvent(index=0, tokens=["a"]), TokensEvent(index=1, tokens=["b"])]
    )
    await redis.xadd(keys.stream("r5"), {"type": "tokens", "data": "{not json"})
    assert await published_tokens(redis, "r5") == ["a", "b"]
    assert await published_tokens(redis, "missing") == []
    unreachable = Redis.from_url(f"redis://127.0.0.1:{free_port()}")
    with pytest.raises(RedisConnectionError):
        await published_tokens(unreachable, "r5")
    await unreachable.aclose()
