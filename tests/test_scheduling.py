"""Start order under contention, with real worker processes.

Priorities shift a request's effective arrival by ``priority * priority_step_ms``;
workers always take the lowest. These tests fill every slot, build a backlog,
then check which request starts next.
"""

from __future__ import annotations

import asyncio
import itertools

import httpx
import pytest
from redis.asyncio import Redis

from llmq.protocol import keys
from tests.support.cluster import BOTH_BACKENDS
from tests.support.native import post_request, record, wait_status
from tests.support.servers import SpawnWorkers, StartApi
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(90)

#: 20 tokens at 100 tok/s: each request holds its slot for ~0.2 s.
SHORT = {"max_tokens": 20}
SLOW = {"model_tokens_per_second": 100}
#: Start times closer than this are taken as simultaneous (claims within a hop).
SAME_MOMENT = 0.02


async def started_order(client: httpx.AsyncClient, ids: list[str]) -> list[str]:
    records = {rid: await wait_status(client, rid, "done") for rid in ids}
    return sorted(ids, key=lambda rid: records[rid]["started_at"])


@BOTH_BACKENDS
async def test_fifo_within_a_priority(start_api: StartApi, spawn_workers: SpawnWorkers) -> None:
    await spawn_workers(1, concurrency=1, **SLOW)
    api = await start_api()
    async with api.client() as client:
        ids = [await post_request(client, f"n{i}", **SHORT) for i in range(6)]
        assert await started_order(client, ids) == ids


@pytest.mark.slow
async def test_higher_priority_overtakes_a_backlog(
    start_api: StartApi, spawn_workers: SpawnWorkers, redis: Redis
) -> None:
    await spawn_workers(1, concurrency=1, **SLOW)
    api = await start_api()
    async with api.client() as client:
        busy = await post_request(client, "busy", max_tokens=40)
        await wait_status(client, busy, "running")
        backlog = [await post_request(client, f"low{i}", priority=5, **SHORT) for i in range(5)]
        urgent = await post_request(client, "urgent", priority=0, **SHORT)
        order = await started_order(client, [busy, *backlog, urgent])
    assert order == [busy, urgent, *backlog]


@pytest.mark.slow
async def test_three_workers_compete(start_api: StartApi, spawn_workers: SpawnWorkers) -> None:
    await spawn_workers(3, concurrency=1, **SLOW)
    api = await start_api()
    async with api.client() as client:
        busy = [await post_request(client, f"busy{i}", max_tokens=40) for i in range(3)]
        for rid in busy:
            await wait_status(client, rid, "running")
        backlog = [await post_request(client, f"low{i}", priority=5, **SHORT) for i in range(9)]
        urgent = [await post_request(client, f"urgent{i}", priority=-1, **SHORT) for i in range(2)]
        order = await started_order(client, busy + backlog + urgent)
        records = {rid: await record(client, rid) for rid in busy + backlog + urgent}
    assert set(order[:3]) == set(busy)
    late = min(records[rid]["started_at"] for rid in backlog)
    assert all(records[rid]["started_at"] <= late + SAME_MOMENT for rid in urgent), order
    # FIFO among equals, across three workers. Claims are atomic and in order; the
    # recorded start times come from three processes a moment after their claims,
    # so two claims a few milliseconds apart may show up swapped.
    started = [records[rid]["started_at"] for rid in backlog]
    for i, j in itertools.combinations(range(len(backlog)), 2):
        assert started[i] <= started[j] + SAME_MOMENT, (i, j, started)
    assert len({r["worker"] for r in records.values()}) == 3


async def test_low_priority_does_not_starve(
    start_api: StartApi, spawn_workers: SpawnWorkers
) -> None:
    """With a 100 ms step, priority 5 waits at most ~0.5 s behind later arrivals."""
    await spawn_workers(1, concurrency=1, **SLOW)
    api = await start_api(priority_step_ms=100)
    async with api.client() as client:
        busy = await post_request(client, "busy", max_tokens=10)
        await wait_status(client, busy, "running")
        low = await post_request(client, "low", priority=5, max_tokens=5)
        stream: list[str] = []
        for i in range(12):  # a steady stream of urgent work, arriving every 100 ms
            stream.append(await post_request(client, f"hi{i}", priority=0, max_tokens=10))
            await asyncio.sleep(0.1)
        low_record = await wait_status(client, low, "done")
        overtook = [
            r
            for r in [await wait_status(client, rid, "done") for rid in stream]
            if r["started_at"] < low_record["started_at"]
        ]
    # Everything that started first arrived within the 0.5 s window after `low`.
    assert overtook, "the test did not create contention"
    assert all(r["created_at"] <= low_record["created_at"] + 0.5 for r in overtook)
    assert len(overtook) < len(stream)


@pytest.mark.timeout(150)
@pytest.mark.slow
async def test_more_running_than_arqs_read_limit(
    start_api: StartApi, spawn_workers: SpawnWorkers, redis: Redis
) -> None:
    """Six workers of 20 slots (arq's read limit: 100 each) run 110 requests; more start."""
    await spawn_workers(6, concurrency=20, model_tokens_per_second=20)
    api = await start_api()
    async with api.client() as client:
        for i in range(110):
            await post_request(client, f"long{i}", max_tokens=400)

        async def all_running() -> bool:
            return int(await redis.zcard(keys.running("mock"))) == 110

        await wait_until(all_running, timeout=30, what="110 running requests")
        assert await redis.zcard(keys.queue("mock")) == 0
        extra = await post_request(client, "extra", max_tokens=2)
        done = await wait_status(client, extra, "done", timeout=10)
    assert done["queue_ms"] < 1000


@BOTH_BACKENDS
async def test_wakeup_not_poll(start_api: StartApi, spawn_workers: SpawnWorkers) -> None:
    """With the fallback poll at 60 s, work still starts at once: enqueue and freed slot."""
    await spawn_workers(1, concurrency=1, poll_seconds=60, **SLOW)
    api = await start_api()
    async with api.client() as client:
        first = await post_request(client, "first", **SHORT)
        second = await post_request(client, "second", **SHORT)
        one = await wait_status(client, first, "done", timeout=10)
        two = await wait_status(client, second, "done", timeout=10)
    assert one["queue_ms"] < 1000
    assert two["started_at"] - one["finished_at"] < 1.0
