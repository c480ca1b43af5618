"""A run times its lease by its own clock: a generation whose lease would have expired
(no renewal answered) stops without writing, while a run whose generation already
ended, and which is only waiting for its terminal event to land, is left alone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from llmq import metrics
from llmq.embedded import EmbeddedRedis
from llmq.schema import DoneEvent, TokensEvent
from tests.support.runs import payload, stream_events
from tests.support.waiting import wait_until
from tests.test_runner import EagerModel
from worker.leases import LeaseClock
from worker.mock import MockModel
from worker.publisher import StreamPublisher
from worker.runner import RequestRunner

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def publisher(redis: Redis) -> AsyncIterator[StreamPublisher]:
    p = StreamPublisher(redis, maxlen=1000, ttl_seconds=60, max_event_tokens=50)
    p.start()
    yield p
    await p.stop()


async def _expiring(runner: RequestRunner) -> None:
    """What the worker's lease-expiry task does, every 10 ms."""
    while True:
        runner.expire_leases()
        await asyncio.sleep(0.01)


async def test_a_generation_whose_lease_ran_out_by_its_clock_stops_without_writing(
    redis: Redis, publisher: StreamPublisher
) -> None:
    model = MockModel(tokens_per_second=50)
    leases = LeaseClock(lease_seconds=0.4, margin_seconds=0.1)
    runner = RequestRunner("w", model, publisher, leases=leases)
    expiry = asyncio.create_task(_expiring(runner))
    try:
        # 1000 tokens would take 20 s; nothing renews the lease
        await asyncio.wait_for(runner.run(payload("cut", max_tokens=1000, seed=1), 1), 10)
    finally:
        expiry.cancel()
    assert "cut" in runner.fenced
    await publisher.written("cut")
    events = [e for _, e in await stream_events(redis, "cut")]
    assert not any(isinstance(e, DoneEvent) for e in events), "a fenced run wrote its end"
    tokens = sum(len(e.tokens) for e in events if isinstance(e, TokensEvent))
    assert tokens < 100, tokens  # about 0.3 s at 50 tokens/s, not 1000
    lost = runner.metrics.take()
    assert sum(v for (name, _, _), v in lost.items() if name == metrics.LEASE_LOST_TOKENS.name)


async def test_a_run_whose_generation_ended_is_not_fenced_while_its_end_waits_for_redis(
    own_redis: EmbeddedRedis,
) -> None:
    client = Redis.from_url(own_redis.url, decode_responses=True)
    admin = Redis.from_url(own_redis.url, decode_responses=True)
    publisher = StreamPublisher(client, maxlen=100, ttl_seconds=60, max_event_tokens=50)
    publisher.start()
    leases = LeaseClock(lease_seconds=0.2, margin_seconds=0.0)
    runner = RequestRunner("w", EagerModel(), publisher, leases=leases)
    expiry = asyncio.create_task(_expiring(runner))
    stalled = await admin.connection_pool.get_connection()
    try:
        await stalled.send_command("DEBUG", "SLEEP", "0.8")  # longer than the lease
        run = asyncio.create_task(runner.run(payload("ends", max_tokens=3, seed=1), 1))

        def generated() -> bool:
            return "ends" in runner.running and "ends" not in runner._generations

        await wait_until(generated, timeout=5, what="the generation to end")
        await asyncio.wait_for(run, 10)
        await stalled.read_response()
    finally:
        expiry.cancel()
        await admin.connection_pool.release(stalled)
        await publisher.stop()
    assert runner.fenced == set()
    events = [e for _, e in await stream_events(admin, "ends")]
    assert isinstance(events[-1], DoneEvent)
    await client.aclose()
    await admin.aclose()
