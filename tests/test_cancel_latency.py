"""Cancellation is prompt: a running request stops within about one token interval.

The model runs in a real worker process; the tests count the tokens written after
the cancel was published, not the milliseconds it took: the worker's tokens and its
reading of the cancel share its event loop, so a loaded machine that delays one
delays the other, and the count holds where a duration would not (the duration is
the benchmarks' figure). They also check what a non-streaming client that
disconnects is answered (499) and what its request becomes.
"""

from __future__ import annotations

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

#: A token every 10 ms: a cancel obeyed 0.1 s late shows as ten tokens more.
TOKENS_PER_SECOND = 100
#: Counted from when the API has published the cancel: the token being produced when
#: it arrives, one more, and the steps a worker delayed by a loaded machine catches
#: up with (one per event-loop turn) before its listener hands the cancel on.
MAX_TOKENS_AFTER_CANCEL = 5
#: For a client that leaves, the API first has to notice (its own event loop, on a
#: loaded machine): counted from when the client gave up, a loaded machine's margin
#: (a second), against the 1000 tokens the request would run to.
MAX_TOKENS_AFTER_LEAVING = 100


async def tokens_in_stream(redis: Redis, rid: str) -> int:
    return len(await published_tokens(redis, rid))


async def wait_tokens(redis: Redis, rid: str, n: int) -> None:
    async def enough() -> bool:
        return await tokens_in_stream(redis, rid) >= n

    await wait_until(enough, timeout=10, what=f"{n} tokens of {rid}")


async def done_event(redis: Redis, rid: str) -> DoneEvent:
    """The request's closing event."""
    entries = await redis.xrange(keys.stream(rid))
    _, fields = entries[-1]
    event = decode_event(fields)
    assert isinstance(event, DoneEvent), fields
    return event


async def test_delete_stops_a_running_request_within_about_one_token(
    start_api: StartApi, spawn_workers: SpawnWorkers, redis: Redis
) -> None:
    await spawn_workers(1, concurrency=1, model_tokens_per_second=TOKENS_PER_SECOND)
    api = await start_api()
    async with api.client() as client:
        rid = await post_request(client, "long", max_tokens=500)
        await wait_tokens(redis, rid, 10)
        r = await client.delete(f"/v1/requests/{rid}")
        assert r.json()["status"] == "cancelling"  # the cancel is published
        before = await tokens_in_stream(redis, rid)
        final = await wait_status(client, rid, "cancelled", timeout=10)
    done = await done_event(redis, rid)
    after = final["completion_tokens"] - before
    assert done.finish_reason == "cancelled"
    assert done.usage.completion_tokens == final["completion_tokens"]
    assert after <= MAX_TOKENS_AFTER_CANCEL, f"{after} tokens after the cancel"


@pytest.mark.slow
async def test_a_non_streaming_client_that_leaves_gets_499_and_its_request_stops(
    start_api: StartApi, spawn_workers: SpawnWorkers, redis: Redis
) -> None:
    await spawn_workers(1, concurrency=1, model_tokens_per_second=TOKENS_PER_SECOND)
    api = await start_api()
    body = {"model": "mock", "prompt": "long", "max_tokens": 1000}
    async with api.client() as client:
        post = client.post("/v1/completions", json=body, timeout=1.0)
        with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes
            await post
        (rid,) = [k.split(":")[-1] for k in await redis.keys(keys.REQUESTS_GLOB)]
        before = await tokens_in_stream(redis, rid)
        final = await wait_status(client, rid, "cancelled", timeout=10)

    def answered() -> bool:
        return ("POST", "/v1/completions", 499) in api.responses.statuses

    await wait_until(answered, timeout=5, what="the API to answer 499")
    done = await done_event(redis, rid)
    assert done.finish_reason == "cancelled"
    assert final["completion_tokens"] - before <= MAX_TOKENS_AFTER_LEAVING
    assert await redis.zcard(keys.running("mock")) == 0
