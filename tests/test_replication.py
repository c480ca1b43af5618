"""Acknowledged enqueues (LLMQ_ENQUEUE_MIN_REPLICAS): answered only once a replica holds them."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from llmq.embedded import EmbeddedRedis
from llmq.protocol import keys
from tests.support.native import wait_status
from tests.support.servers import StartApi, StartWorker
from tests.support.waiting import wait_until

BODY = {"model": "mock", "prompt": "keep me", "max_tokens": 5}


@pytest.fixture
async def replica(redis_server: EmbeddedRedis, redis: Redis) -> AsyncIterator[Redis]:
    with EmbeddedRedis() as server:
        client = Redis.from_url(server.url, decode_responses=True)
        await client.replicaof("127.0.0.1", redis_server.port)

        async def linked() -> bool:
            info = await client.info("replication")
            return bool(info.get("master_link_status") == "up")

        await wait_until(linked, timeout=10, what="the replica to sync")
        yield client
        await client.aclose()
    # the primary forgets the replica once it is gone
    await wait_until(
        lambda: _no_replicas(redis), timeout=10, what="the primary to drop the replica"
    )


async def _no_replicas(redis: Redis) -> bool:
    return int((await redis.info("replication"))["connected_slaves"]) == 0


async def test_an_enqueue_no_replica_acknowledges_is_refused_and_cancelled(
    start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    """A worker may have started it meanwhile (hand-off is immediate): it is stopped."""
    await start_worker()
    api = await start_api(enqueue_min_replicas=1, enqueue_replica_timeout_ms=100)
    async with api.client() as client:
        r = await client.post("/v1/requests", json={**BODY, "max_tokens": 400})
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "replica_timeout"
        assert r.headers["retry-after"] == "1"
    assert int(await redis.zcard(keys.queue("mock"))) == 0
    records = [k async for k in redis.scan_iter(keys.REQUESTS_GLOB)]
    assert len(records) == 1

    async def cancelled() -> bool:
        status: str | None = await redis.hget(records[0], "status")  # type: ignore[misc]
        return status == "cancelled"

    await wait_until(cancelled, timeout=5, what="the refused request to be cancelled")
    tokens: str | None = await redis.hget(records[0], "completion_tokens")  # type: ignore[misc]
    assert int(tokens or 0) < 400


@pytest.mark.slow
async def test_an_enqueue_a_replica_holds_is_accepted(
    start_api: StartApi, start_worker: StartWorker, replica: Redis
) -> None:
    await start_worker()
    api = await start_api(enqueue_min_replicas=1, enqueue_replica_timeout_ms=2000)
    async with api.client() as client:
        r = await client.post("/v1/requests", json=BODY)
        assert r.status_code == 202, r.text
        rid = r.json()["id"]
        assert await replica.exists(keys.request(rid))
        await wait_status(client, rid, "done")
