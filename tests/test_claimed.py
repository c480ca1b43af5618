"""The claim script reads the job for arq's run_job, which then skips its own read;
and the arq this worker's bypasses rely on (listed in worker/queue_worker.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from importlib.metadata import version

import pytest
from redis.asyncio import Redis

from llmq.connection import make_pool
from llmq.protocol import keys
from llmq.protocol.queue import Claim, Enqueue, Queue
from llmq.schema import DoneEvent
from llmq.settings import WorkerSettings
from tests.support.jobs import enqueue_raw
from tests.support.native import post_request, record, wait_status
from tests.support.runs import payload, stream_events
from tests.support.servers import RunningApi
from tests.support.waiting import wait_until
from worker.mock import MockBackend
from worker.publisher import StreamPublisher
from worker.queue_worker import ARQ_CHECKED, ClaimedJob, ClaimingRedis, QueueWorker, carry
from worker.runner import RequestRunner

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def arq_pool(redis_url: str) -> AsyncIterator[ClaimingRedis]:
    pool = ClaimingRedis(
        pool_or_conn=make_pool(WorkerSettings(redis_url=redis_url), decode_responses=False)
    )
    yield pool
    await pool.aclose(close_connection_pool=True)


async def claim(queue: Queue) -> Claim:
    return await queue.claim(
        "mock", lease_ms=1000, in_progress_ms=1000, budget_left=None, idle=True
    )


async def test_a_claim_returns_the_job_and_bumps_its_try_count(arq_pool: ClaimingRedis) -> None:
    queue = Queue(arq_pool, stream_maxlen=100, ttl_seconds=60)
    await enqueue_raw(queue, "r1", b'{"job": 1}')
    first = await queue.claim(
        "mock", lease_ms=1000, in_progress_ms=1000, budget_left=None, idle=True
    )
    assert (first.request_id, first.job, first.attempt) == ("r1", b'{"job": 1}', 1)
    assert await queue.requeue("mock", "r1", first.attempt)
    again = await queue.claim(
        "mock", lease_ms=1000, in_progress_ms=1000, budget_left=None, idle=True
    )
    assert (again.request_id, again.attempt) == ("r1", 2)
    assert 0 < await arq_pool.ttl(keys.retry("r1", "mock")) <= 88400


async def test_the_carried_claim_answers_one_read_only(arq_pool: ClaimingRedis) -> None:
    async def in_task() -> list[object]:
        carry(ClaimedJob("r2", b"job", 3))
        async with arq_pool.pipeline(transaction=True) as pipe:
            pipe.get(keys.JOB_PREFIX + "r2")
            pipe.incr(keys.RETRY_PREFIX + "r2")
            pipe.expire(keys.RETRY_PREFIX + "r2", 88400)
            answered = await pipe.execute()
        async with arq_pool.pipeline(transaction=True) as pipe:  # a real one now
            pipe.incr(keys.RETRY_PREFIX + "r2")
            real = await pipe.execute()
        return [answered, real]

    answered, real = await asyncio.create_task(in_task())
    assert answered == [b"job", 3, True]
    assert real == [1]  # it reached Redis, where nothing had counted before


async def test_a_read_arq_was_not_expected_to_make_fails_loudly(arq_pool: ClaimingRedis) -> None:
    async def in_task() -> None:
        carry(ClaimedJob("r3", b"job", 1))
        async with arq_pool.pipeline(transaction=True) as pipe:
            pipe.get(keys.JOB_PREFIX + "someone-else")

    with pytest.raises(RuntimeError, match="expected"):
        await asyncio.create_task(in_task())


async def test_a_request_run_once_counts_one_attempt(stack: RunningApi, redis: Redis) -> None:
    async with stack.client() as client:
        rid = await post_request(client, max_tokens=2)
        await wait_status(client, rid, "done")
        assert (await record(client, rid))["attempts"] == 1


def test_the_installed_arq_is_the_one_the_bypasses_were_checked_against() -> None:
    assert version("arq") == ARQ_CHECKED, (
        "arq changed: re-check every bypass listed in worker/queue_worker.py's docstring, "
        "then set ARQ_CHECKED"
    )


def _instant_worker(
    arq_pool: ClaimingRedis, max_jobs: int
) -> tuple[Queue, StreamPublisher, QueueWorker]:
    """A worker in this process on a mock that answers at once (its publisher started)."""
    queue = Queue(arq_pool, stream_maxlen=100, ttl_seconds=60)
    publisher = StreamPublisher(arq_pool, maxlen=100, ttl_seconds=60, max_event_tokens=50)
    publisher.start()
    model = MockBackend(tokens_per_second=1e9, prefill_seconds_per_token=0.0)
    worker = QueueWorker(
        model="mock",
        worker_id="w",
        runner=RequestRunner("w", model, publisher),
        redis=arq_pool,
        queue=queue,
        max_jobs=max_jobs,
        poll_seconds=60,
        job_timeout=60,
        lease_seconds=10,
    )
    worker.ctx["redis"] = worker.pool
    return queue, publisher, worker


async def test_arqs_own_run_job_takes_the_claim_and_ends_through_llmq(
    arq_pool: ClaimingRedis, redis: Redis
) -> None:
    """arq's unmodified ``run_job``: its read is answered by the claim (arq's own key
    names never reach Redis) and it ends through the worker's ``finish_job``."""
    queue, publisher, worker = _instant_worker(arq_pool, max_jobs=2)
    job = payload("once", max_tokens=3, seed=1)
    assert (await queue.admit([Enqueue.of(job, priority_step_ms=1000)], max_depth=10)).queued
    try:
        await worker._claim_free_slots()
        assert set(worker.tasks) == {"once"}
        await worker.tasks["once"]
        assert worker.busy_slots == 0
        _, last = (await stream_events(redis, "once"))[-1]
        assert isinstance(last, DoneEvent)
        arqs_names = [
            p + "once" for p in (keys.JOB_PREFIX, keys.RETRY_PREFIX, keys.IN_PROGRESS_PREFIX)
        ]
        assert await redis.exists(*arqs_names) == 0  # arq read nothing, wrote nothing
        assert await redis.zscore(keys.running("mock"), "once") is None  # llmq's finish ran
        assert await redis.exists(keys.job("once", "mock"), keys.retry("once", "mock")) == 0
    finally:
        await publisher.stop()


async def test_a_runs_slot_is_free_once_its_model_is_done(
    arq_pool: ClaimingRedis, redis: Redis
) -> None:
    """The slot is the model's (an inference server's), so it is not held through the
    run's Redis bookkeeping: with one slot, the next request is claimed while the
    first run's lease release is still on its way."""
    queue, publisher, worker = _instant_worker(arq_pool, max_jobs=1)
    release = asyncio.Event()
    finish = queue.finish

    async def finish_when_told(
        model: str, request_id: str, attempt: int | None, used: int | None = None
    ) -> None:
        if request_id == "first":
            await release.wait()
        await finish(model, request_id, attempt, used)

    queue.finish = finish_when_told  # type: ignore[method-assign]
    jobs = [payload(rid, max_tokens=3, seed=1) for rid in ("first", "second")]
    assert (await queue.admit([Enqueue.of(j, priority_step_ms=1000) for j in jobs], 10)).queued
    try:
        await worker._claim_free_slots()
        assert set(worker.tasks) == {"first"}
        await wait_until(lambda: worker.busy_slots == 0, timeout=10, what="the slot freed")
        assert not worker.tasks["first"].done(), "the first run still releases its lease"
        await worker._claim_free_slots()
        assert set(worker.tasks) == {"first", "second"}
        release.set()
        await asyncio.gather(worker.tasks["first"], worker.tasks["second"])
        assert worker.busy_slots == 0
        for rid in ("first", "second"):
            _, last = (await stream_events(redis, rid))[-1]
            assert isinstance(last, DoneEvent)
            assert await redis.zscore(keys.running("mock"), rid) is None
    finally:
        release.set()
        await publisher.stop()
