"""A run times its lease by its own clock: a generation whose lease would have expired
(no renewal answered) pauses at once; it stops without writing if the lease was lost,
and goes on if a renewal says the lease holds (Redis was only stalled). A run whose
generation already ended, and which only waits for its terminal event to land, is
left alone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from llmq import metrics
from llmq.embedded import EmbeddedRedis
from llmq.model.interface import GenerationRequest
from llmq.schema import DoneEvent, TokensEvent
from tests.support.runs import payload, stream_events
from tests.support.waiting import wait_until
from tests.test_runner import EagerModel
from worker.leases import LeaseClock
from worker.mock import MockBackend
from worker.publisher import StreamPublisher
from worker.run import RunStatus
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


def _paused(runner: RequestRunner, rid: str) -> bool:
    run = runner.runs.get(rid)
    return run is not None and run.status is RunStatus.PAUSING


async def _tokens(redis: Redis, rid: str) -> list[str]:
    events = [e for _, e in await stream_events(redis, rid)]
    return [t for e in events if isinstance(e, TokensEvent) for t in e.tokens]


async def test_a_generation_whose_lease_ran_out_by_its_clock_pauses_then_stops_if_lost(
    redis: Redis, publisher: StreamPublisher
) -> None:
    leases = LeaseClock(lease_seconds=0.4, margin_seconds=0.1)
    runner = RequestRunner("w", MockBackend(tokens_per_second=50), publisher, leases=leases)
    expiry = asyncio.create_task(_expiring(runner))
    # 1000 tokens would take 20 s; nothing renews the lease
    run = asyncio.create_task(runner.run(payload("cut", max_tokens=1000, seed=1), 1))
    try:
        await wait_until(lambda: _paused(runner, "cut"), timeout=5, what="the pause")
        await publisher.written("cut")
        at_pause = len(await _tokens(redis, "cut"))
        assert at_pause < 100, at_pause  # about 0.3 s at 50 tokens/s, not 1000
        runner.fence("cut")  # the next renewal's verdict: lost
        await asyncio.wait_for(run, 10)
    finally:
        expiry.cancel()
    await publisher.written("cut")
    events = [e for _, e in await stream_events(redis, "cut")]
    assert not any(isinstance(e, DoneEvent) for e in events), "a fenced run wrote its end"
    assert len(await _tokens(redis, "cut")) == at_pause, "it generated while paused"
    lost = runner.metrics.take()
    assert sum(v for (name, _, _), v in lost.items() if name == metrics.LEASE_LOST_TOKENS.name)


async def test_a_paused_generation_resumes_when_a_renewal_says_the_lease_holds(
    redis: Redis, publisher: StreamPublisher
) -> None:
    """Redis was only stalled: its lease clock did not run, the lease is still this
    run's. The generation goes on from where it paused; the text is the undisturbed one."""
    leases = LeaseClock(lease_seconds=0.3, margin_seconds=0.0)
    runner = RequestRunner("w", MockBackend(tokens_per_second=100), publisher, leases=leases)
    expiry = asyncio.create_task(_expiring(runner))
    run = asyncio.create_task(runner.run(payload("stall", max_tokens=60, seed=3), 1))
    try:
        await wait_until(lambda: _paused(runner, "stall"), timeout=5, what="the pause")
        # the renewal answered ok: what the heartbeat does
        runner.renewed("stall", asyncio.get_running_loop().time() + 60, 0)
        runner.resume("stall")
        await asyncio.wait_for(run, 10)
    finally:
        expiry.cancel()
    await publisher.written("stall")
    assert runner.ended == {}  # neither fenced nor unfinished
    expected = MockBackend(tokens_per_second=1e9, prefill_seconds_per_token=0)
    request = GenerationRequest(prompt="p", max_tokens=60, seed=3, prompt_tokens=1)
    assert await _tokens(redis, "stall") == [t async for t in expected.generate(request)]
    events = [e for _, e in await stream_events(redis, "stall")]
    assert [type(e).__name__ for e in events].count("DoneEvent") == 1
    assert isinstance(events[-1], DoneEvent) and events[-1].usage.completion_tokens == 60


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
            run = runner.runs.get("ends")
            return run is not None and run.generation is None

        await wait_until(generated, timeout=5, what="the generation to end")
        await asyncio.wait_for(run, 10)
        await stalled.read_response()
    finally:
        expiry.cancel()
        await admin.connection_pool.release(stalled)
        await publisher.stop()
    assert runner.ended == {}  # neither fenced nor unfinished
    events = [e for _, e in await stream_events(admin, "ends")]
    assert isinstance(events[-1], DoneEvent)
    await client.aclose()
    await admin.aclose()
