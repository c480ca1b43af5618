"""Foreign or corrupt entries in the queue are logged and skipped; the worker lives on."""

from __future__ import annotations

import json

import pytest
from redis.asyncio import Redis

from llmq import keys
from llmq.queue import Queue, serialize_job
from llmq.schema import Lifecycle
from tests.conftest import SpawnWorkers, StartApi
from tests.native import record, submit, wait_status
from tests.procs import alive
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


async def enqueue_raw(redis: Redis, rid: str, job: bytes) -> None:
    queue = Queue(redis, stream_maxlen=100, ttl_seconds=60)
    assert await queue.enqueue(
        rid,
        "mock",
        job=job,
        score=1,
        max_depth=100,
        cost=1,
        deadline_ms=2**50,
        record={"id": rid, "model": "mock", "status": "queued", "created_at": "1"},
        lifecycle=Lifecycle(event="queued", request_id=rid, model="mock", ts=0.0),
    )


@pytest.mark.parametrize(
    "job",
    [
        b"\x80\x04not json at all",  # e.g. a pickled job of some other arq app
        serialize_job({"request_id": "bad2", "prompt": 42}, 0),  # not a JobPayload
        json.dumps({"f": "no_such_function", "a": [], "k": {}, "t": 1, "et": 0}).encode(),
    ],
    ids=["not-json", "invalid-payload", "unknown-function"],
)
async def test_a_corrupt_job_ends_with_an_error_and_the_worker_goes_on(
    start_api: StartApi, spawn_workers: SpawnWorkers, redis: Redis, job: bytes
) -> None:
    (worker,) = await spawn_workers(1, concurrency=1)
    api = await start_api()
    await enqueue_raw(redis, "bad2", job)
    await redis.publish(keys.wake("mock"), "bad2")
    async with api.client() as client:
        rid = await submit(client, "after the bad one", max_tokens=3)
        await wait_status(client, rid, "done")
        bad = await wait_status(client, "bad2", "failed")
        assert bad["error"], bad
        assert (await record(client, rid))["completion_tokens"] == 3
    assert alive(worker.pid)

    async def released() -> bool:
        return int(await redis.zcard(keys.running("mock"))) == 0

    await wait_until(released, timeout=5, what="both requests to leave the running set")
