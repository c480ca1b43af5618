"""Cancellation: disconnects and DELETE stop work and free slots; reconnects do not."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from redis.asyncio import Redis

from llmq.protocol import keys
from tests.support.native import post_request, record, wait_status
from tests.support.servers import SpawnWorkers, StartApi
from tests.support.sse import frames
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

#: 50 tokens/s: a token every 20 ms, so "about one interval" is measurable.
MODEL = {"model_tokens_per_second": 50}


async def stream_len_settles(redis: Redis, rid: str) -> int:
    """XLEN once the stream stopped growing (no new entry for 0.2 s)."""
    last = -1
    stable_since = asyncio.get_running_loop().time()

    async def settled() -> bool:
        nonlocal last, stable_since
        now_len = int(await redis.xlen(keys.stream(rid)))
        now = asyncio.get_running_loop().time()
        if now_len != last:
            last, stable_since = now_len, now
        return now - stable_since > 0.2

    await wait_until(settled, timeout=10, what="the stream to stop growing", interval=0.02)
    return last


async def test_disconnect_mid_stream_stops_generation_and_frees_the_slot(
    start_api: StartApi, spawn_workers: SpawnWorkers, redis: Redis
) -> None:
    await spawn_workers(1, concurrency=1, **MODEL)
    api = await start_api()
    async with api.client() as client:
        body = {"model": "mock", "prompt": "long", "max_tokens": 500, "stream": True}
        async with client.stream("POST", "/v1/completions", json=body) as r:
            n = 0
            async for _ in frames(r):
                n += 1
                if n == 5:
                    break
        # a request queued behind the cancelled one
        waiting = await post_request(client, "next", max_tokens=3)
        done = await wait_status(client, waiting, "done", timeout=10)
    ids = [k.split(":")[-1] for k in await redis.keys(keys.REQUESTS_GLOB)]
    cancelled = [i for i in ids if i != waiting]
    assert len(cancelled) == 1
    rec = await redis.hgetall(keys.request(cancelled[0]))  # type: ignore[misc]
    assert rec["status"] == "cancelled" and rec["finish_reason"] == "cancelled"
    assert int(rec["completion_tokens"]) < 100
    # the slot freed at once: the queued request did not wait for 500 tokens
    assert done["queue_ms"] < 2000
    length = await stream_len_settles(redis, cancelled[0])
    assert length < 100


async def test_cancel_while_queued_never_runs(
    start_api: StartApi, spawn_workers: SpawnWorkers, redis: Redis
) -> None:
    await spawn_workers(1, concurrency=1, **MODEL)
    api = await start_api()
    async with api.client() as client:
        busy = await post_request(client, "busy", max_tokens=25)
        await wait_status(client, busy, "running")
        body = {"model": "mock", "prompt": "queued", "max_tokens": 5, "stream": True}
        async with client.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200  # headers only: the request is still queued
        ids = {k.split(":")[-1] for k in await redis.keys(keys.REQUESTS_GLOB)} - {busy}
        (queued,) = ids
        rec = await wait_status(client, queued, "cancelled", timeout=10)
        await wait_status(client, busy, "done", timeout=10)
        after = await record(client, queued)
    assert rec["started_at"] is None and after["started_at"] is None
    assert await redis.zcard(keys.queue("mock")) == 0
    assert not await redis.exists(keys.job(queued, "mock"))
    events = [f["type"] for _, f in await redis.xrange(keys.stream(queued))]
    assert events == ["done"]


async def test_non_streaming_disconnect_cancels(
    start_api: StartApi, spawn_workers: SpawnWorkers
) -> None:
    await spawn_workers(1, concurrency=1, **MODEL)
    api = await start_api()
    async with api.client() as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post(
                "/v1/completions",
                json={"model": "mock", "prompt": "slow", "max_tokens": 500},
                timeout=0.5,
            )
        follow_up = await post_request(client, "after", max_tokens=2)
        done = await wait_status(client, follow_up, "done", timeout=10)
    assert done["queue_ms"] < 2000


async def test_delete_running_and_queued(
    start_api: StartApi, spawn_workers: SpawnWorkers, redis: Redis
) -> None:
    await spawn_workers(1, concurrency=1, **MODEL)
    api = await start_api()
    async with api.client() as client:
        running = await post_request(client, "running", max_tokens=500)
        await wait_status(client, running, "running")
        queued = await post_request(client, "queued", max_tokens=5)
        r1 = (await client.delete(f"/v1/requests/{queued}")).json()
        r2 = (await client.delete(f"/v1/requests/{running}")).json()
        stopped = await wait_status(client, running, "cancelled", timeout=5)
        again = (await client.delete(f"/v1/requests/{running}")).json()
        missing = await client.delete("/v1/requests/" + "f" * 32)
    assert r1["status"] == "cancelled" and r2["status"] == "cancelling"
    assert again == {"id": running, "object": "request", "status": "cancelled", "cancelled": False}
    assert stopped["completion_tokens"] < 100
    assert (await record_of(redis, queued))["status"] == "cancelled"
    assert missing.status_code == 404


async def record_of(redis: Redis, rid: str) -> dict[str, str]:
    fields: dict[str, str] = await redis.hgetall(keys.request(rid))  # type: ignore[misc]
    return fields


async def test_native_reconnect_does_not_cancel(
    start_api: StartApi, spawn_workers: SpawnWorkers
) -> None:
    await spawn_workers(1, concurrency=2, model_tokens_per_second=200)
    api = await start_api()
    async with api.client() as client:
        rid = await post_request(client, "keep going", max_tokens=40)
        async with client.stream("GET", f"/v1/requests/{rid}/events") as r:
            async for _ in frames(r):
                break
        done = await wait_status(client, rid, "done")
    assert done["completion_tokens"] == 40
