"""Cancellation is prompt: a running request stops within about one token interval.

The model runs at 50 tokens/s (a token every 20 ms) in a real worker process; the
tests count the tokens written after the cancel was sent, and check what a
non-streaming client that disconnects is answered (499) and what its request
becomes.
"""

from __future__ import annotations

import time

import httpx
import pytest
from redis.asyncio import Redis

from llmq.protocol import keys
from llmq.protocol.streams import published_tokens
from llmq.schema import DoneEvent, decode_event
from tests.support.native import post_request, wait_status
from tests.support.servers import SpawnWorkers, StartApi
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

TOKENS_PER_SECOND = 50
#: About one token interval, plus headroom for a loaded 2-core machine: the token
#: being produced when the cancel arrives, one more, and one for the scheduler.
MAX_TOKENS_AFTER_CANCEL = 3
#: The closing event is written this soon after the cancel: measured 3-15 ms here.
MAX_STOP_SECONDS = 0.1


async def tokens_in_stream(redis: Redis, rid: str) -> int:
    return len(await published_tokens(redis, rid))


async def wait_tokens(redis: Redis, rid: str, n: int) -> None:
    async def enough() -> bool:
        return await tokens_in_stream(redis, rid) >= n

    await wait_until(enough, timeout=10, what=f"{n} tokens of {rid}")


async def done_event(redis: Redis, rid: str) -> tuple[float, DoneEvent]:
    """The request's closing event and when Redis stored it (Unix seconds)."""
    entries = await redis.xrange(keys.stream(rid))
    stream_id, fields = entries[-1]
    event = decode_event(fields)
    assert isinstance(event, DoneEvent), fields
    return int(stream_id.split("-")[0]) / 1000, event


async def test_delete_stops_a_running_request_within_about_one_token(
    start_api: StartApi, spawn_workers: SpawnWorkers, redis: Redis
) -> None:
    await spawn_workers(1, concurrency=1, model_tokens_per_second=TOKENS_PER_SECOND)
    api = await start_api()
    async with api.client() as client:
        rid = await post_request(client, "long", max_tokens=500)
        await wait_tokens(redis, rid, 10)
        before = await tokens_in_stream(redis, rid)
        sent_at = time.time()
        r = await client.delete(f"/v1/requests/{rid}")
        assert r.json()["status"] == "cancelling"
        final = await wait_status(client, rid, "cancelled", timeout=10)
    ended_at, done = await done_event(redis, rid)
    after = final["completion_tokens"] - before
    assert done.finish_reason == "cancelled"
    assert done.usage.completion_tokens == final["completion_tokens"]
    assert after <= MAX_TOKENS_AFTER_CANCEL, f"{after} tokens after the cancel"
    assert ended_at - sent_at < MAX_STOP_SECONDS


async def test_a_non_streaming_client_that_leaves_gets_499_and_its_request_stops(
    start_api: StartApi, spawn_workers: SpawnWorkers, redis: Redis
) -> None:
    await spawn_workers(1, concurrency=1, model_tokens_per_second=TOKENS_PER_SECOND)
    api = await start_api()
    body = {"model": "mock", "prompt": "long", "max_tokens": 500}
    async with api.client() as client:
        post = client.post("/v1/completions", json=body, timeout=1.0)
        with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes
            await post
        left_at = time.time()
        (rid,) = [k.split(":")[-1] for k in await redis.keys(keys.REQUESTS_GLOB)]
        before = await tokens_in_stream(redis, rid)
        final = await wait_status(client, rid, "cancelled", timeout=10)

    def answered() -> bool:
        return ("POST", "/v1/completions", 499) in api.responses.statuses

    await wait_until(answered, timeout=5, what="the API to answer 499")
    ended_at, done = await done_event(redis, rid)
    assert done.finish_reason == "cancelled"
    assert final["completion_tokens"] - before <= MAX_TOKENS_AFTER_CANCEL
    assert ended_at - left_at < MAX_STOP_SECONDS
    assert await redis.zcard(keys.running("mock")) == 0
