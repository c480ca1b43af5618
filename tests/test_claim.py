"""What a claim takes: only what fits the worker's token budget, never a request
past its queue deadline.

The claim script's checks are tested directly against Redis, on and off; the
worker test uses one worker, so that a request left queued can only be the
budget's doing (no other worker could be taking turns with it).
"""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from llmq.protocol import keys
from llmq.protocol.queue import Queue, now_ms
from llmq.protocol.streams import published_tokens
from tests.support.jobs import claim_with, enqueue_costing
from tests.support.native import post_request, record, wait_status
from tests.support.servers import StartApi, StartWorker
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def queue(redis: Redis) -> Queue:
    return Queue(redis, stream_maxlen=100, ttl_seconds=60)


async def test_the_claim_takes_a_request_only_within_the_budget_left(
    redis: Redis, queue: Queue
) -> None:
    await enqueue_costing(queue, "big", cost=600)
    over = await claim_with(queue, budget_left=599, idle=False)
    assert over.request_id is None
    assert await redis.zrange(keys.queue("mock"), 0, -1) == ["big"]
    fits = await claim_with(queue, budget_left=600, idle=False)
    assert fits.request_id == "big" and fits.cost == 600
    assert await redis.zcard(keys.queue("mock")) == 0


async def test_an_idle_worker_or_one_without_a_budget_takes_any_request(queue: Queue) -> None:
    await enqueue_costing(queue, "a", cost=600, score=1)
    await enqueue_costing(queue, "b", cost=600, score=2)
    idle = await claim_with(queue, budget_left=1, idle=True)
    unlimited = await claim_with(queue, budget_left=None, idle=False)
    assert (idle.request_id, unlimited.request_id) == ("a", "b")


async def test_a_worker_leaves_a_request_queued_that_its_budget_cannot_hold(
    start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    """One worker with 8 free slots and budget for one long request (cost 610 of
    1000): the second long one waits while the first runs, then runs on it."""
    await start_worker(concurrency=8, worker_token_budget=1000, model_tokens_per_second=100)
    api = await start_api()
    async with api.client() as client:
        first = await post_request(client, "ten words " * 5, max_tokens=600)
        await wait_status(client, first, "running")
        second = await post_request(client, "ten words " * 5, max_tokens=600)
        small = await post_request(client, "short", max_tokens=5)  # fits, but queued behind it
        by_now = len(await published_tokens(redis, first)) + 30  # 0.3 s: many claims later

        async def first_went_on() -> bool:
            return len(await published_tokens(redis, first)) >= by_now

        await wait_until(first_went_on, timeout=10, what="the first request to go on")
        waiting = [await record(client, rid) for rid in (second, small)]
        queued = await redis.zrange(keys.queue("mock"), 0, -1)
        await client.delete(f"/v1/requests/{first}")
        after = await wait_status(client, second, "running", "done", timeout=10)
    assert [r["status"] for r in waiting] == ["queued", "queued"]
    assert queued == [second, small]
    assert after["worker"] is not None


async def test_the_claim_drops_a_request_past_its_queue_deadline(
    redis: Redis, queue: Queue
) -> None:
    """Checked by the claim itself, not only by the sweep (which may run much later)."""
    await enqueue_costing(queue, "late", cost=1, score=1, deadline_ms=now_ms() - 1)
    await enqueue_costing(queue, "timely", cost=1, score=2)
    claim = await claim_with(queue, budget_left=None, idle=True)
    assert claim.expired == ["late"]
    assert claim.request_id == "timely"
    assert await redis.zcard(keys.queue("mock")) == 0
    assert not await redis.exists(keys.job("late", "mock"))
