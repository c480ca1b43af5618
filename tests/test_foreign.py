"""Foreign or corrupt entries in the queue are logged and skipped; the worker lives on."""

from __future__ import annotations

import json

import pytest
from redis.asyncio import Redis

from llmq.protocol import keys
from llmq.protocol.arq_job import serialize_job
from llmq.protocol.queue import Queue
from tests.support.jobs import enqueue_raw
from tests.support.native import post_request, record, wait_status
from tests.support.processes import alive
from tests.support.servers import SpawnWorkers, StartApi
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


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
    await enqueue_raw(Queue(redis, stream_maxlen=100, ttl_seconds=60), "bad2", job)
    await redis.publish(keys.wake("mock"), "bad2")
    async with api.client() as client:
        rid = await post_request(client, "after the bad one", max_tokens=3)
        await wait_status(client, rid, "done")
        bad = await wait_status(client, "bad2", "failed")
        assert bad["error"], bad
        assert (await record(client, rid))["completion_tokens"] == 3
    assert alive(worker.pid)

    async def released() -> bool:
        return int(await redis.zcard(keys.running("mock"))) == 0

    await wait_until(released, timeout=5, what="both requests to leave the running set")
