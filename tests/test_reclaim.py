"""A worker that claims again a request it still runs (it was stopped while holding
it: the lease ran out, the request was requeued) ends its own older attempt first.

Runs are keyed by request id in the runner and in arq: two attempts of one request in
one process at once overwrote each other (arq's ``KeyError``, two ``done`` events, a
token missing at an OpenAI client), as the chaos campaign found.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import cast

import pytest
from redis.asyncio import ConnectionPool, Redis

from llmq.model.interface import GenerationRequest
from llmq.protocol import keys
from llmq.protocol.queue import Enqueue, Queue
from llmq.schema import DoneEvent, StartedEvent, TokensEvent
from tests.support.runs import payload, stream_events
from tests.support.waiting import wait_until
from worker.publisher import StreamPublisher
from worker.queue_worker import ClaimingRedis, QueueWorker
from worker.runner import RequestRunner

pytestmark = pytest.mark.timeout(30)

TOKENS = 100


class GatedModel:
    """A first run stops after 10 tokens until ``gate`` opens; a resumed one runs on."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    async def generate(self, request: GenerationRequest) -> AsyncIterator[str]:
        for i in range(len(request.generated), request.max_tokens):
            if i == 10 and not request.generated:
                await self.gate.wait()
            await asyncio.sleep(0)
            yield f" t{i}"


async def _expire_leases(redis: Redis) -> None:
    """Lease time jumps 2 s ahead: every running lease of ``mock`` is due."""
    clock = keys.clock("mock")
    lease = await cast("Awaitable[str | None]", redis.hget(clock, "lease"))
    await cast("Awaitable[int]", redis.hset(clock, "lease", str(int(lease or 0) + 2_000)))


async def test_a_request_claimed_again_by_the_worker_still_running_it_runs_once_at_a_time(
    redis: Redis, redis_url: str
) -> None:
    arq = ClaimingRedis(
        connection_pool=ConnectionPool.from_url(redis_url),
        job_serializer=None,
        job_deserializer=None,
        default_queue_name=keys.queue("mock"),
    )
    queue = Queue(arq, stream_maxlen=1000, ttl_seconds=60)
    publisher = StreamPublisher(arq, maxlen=1000, ttl_seconds=60, max_event_tokens=50)
    publisher.start()
    model = GatedModel()
    runner = RequestRunner("w", model, publisher)
    worker = QueueWorker(
        model="mock",
        worker_id="w",
        runner=runner,
        redis=arq,
        queue=queue,
        max_jobs=4,
        poll_seconds=60,
        job_timeout=60,
        lease_seconds=1,
    )
    worker.ctx["redis"] = worker.pool
    job = payload("twice", max_tokens=TOKENS, seed=5)
    assert (await queue.admit([Enqueue.of(job, priority_step_ms=1000)], max_depth=10)).queued
    try:

        async def claim() -> None:
            got = await queue.claim(
                "mock", lease_ms=1000, in_progress_ms=60_000, budget_left=None, idle=True
            )
            assert got.request_id == "twice"
            await worker._take(got)

        await claim()
        first = worker.tasks["twice"]
        await wait_until(lambda: runner.produced().get("twice", 0) >= 10, timeout=10, what="tokens")
        await publisher.written("twice")
        await _expire_leases(redis)
        assert await queue.reap("mock") == [("twice", 1)]
        await claim()  # attempt 2, on the worker whose attempt 1 waits at the gate
        second = worker.tasks["twice"]
        await asyncio.wait_for(second, timeout=20)
        assert first.done(), "attempt 1 still runs beside attempt 2"
        model.gate.set()
        await asyncio.gather(first, second)  # neither failed (arq's bookkeeping)
    finally:
        model.gate.set()
        await publisher.stop()
        await arq.aclose(close_connection_pool=True)
    events = [e for _, e in await stream_events(redis, "twice")]
    assert [e.attempt for e in events if isinstance(e, StartedEvent)] == [1, 2]
    assert sum(isinstance(e, DoneEvent) for e in events) == 1, "both attempts wrote an end"
    assert [t for e in events if isinstance(e, TokensEvent) for t in e.tokens] == [
        f" t{i}" for i in range(TOKENS)
    ]
    indices = sorted(
        e.index + i for e in events if isinstance(e, TokensEvent) for i in range(len(e.tokens))
    )
    assert sorted(set(indices)) == list(range(TOKENS))
