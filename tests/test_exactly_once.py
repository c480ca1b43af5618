"""Every token exactly once, whatever the stream holds twice.

A re-run can write an index that is already in the stream (a stopping worker's
last write racing its re-run, tokens a dead worker generated but never wrote).
These tests write such overlaps into a request's stream themselves, with the
stream helpers a worker uses, while a real API relays it to an OpenAI client: the
client must see each index once. No worker runs (the model is accepted without
one), so nothing but the test writes to the stream.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from llmq.protocol import keys
from llmq.protocol.streams import add_event
from llmq.schema import DoneEvent, Event, StartedEvent, Timings, TokensEvent, Usage
from tests.support.servers import StartApi
from tests.support.sse import frames
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(30)

WORDS = [f" w{i}" for i in range(10)]


def tokens(start: int, end: int) -> TokensEvent:
    return TokensEvent(index=start, tokens=WORDS[start:end])


#: Two runs whose writes overlap: the first wrote 0-4, the re-run rewrites 3-7 and
#: 5-9, and a late duplicate of 8-9 follows (written after the client saw 0-4).
FIRST: list[Event] = [StartedEvent(worker="w-1", attempt=1, queue_ms=1.0), tokens(0, 5)]
OVERLAPS: list[Event] = [
    StartedEvent(worker="w-2", attempt=2, queue_ms=1.0),
    tokens(3, 8),
    tokens(5, 10),
    tokens(8, 10),
    DoneEvent(
        finish_reason="length",
        usage=Usage(prompt_tokens=1, completion_tokens=10, total_tokens=11),
        timings=Timings(queue_ms=1.0, prefill_ms=1.0, decode_ms=1.0),
    ),
]


async def write(redis: Redis, rid: str, events: list[Event]) -> None:
    pipe = redis.pipeline(transaction=False)
    for event in events:
        add_event(pipe, rid, event, maxlen=1000, ttl=60)
    await pipe.execute()


async def only_request(redis: Redis) -> str:
    found: list[str] = []

    async def accepted() -> bool:
        found[:] = [k.split(":")[-1] for k in await redis.keys(keys.REQUESTS_GLOB)]
        return len(found) == 1

    await wait_until(accepted, timeout=10, what="the request to be accepted")
    return found[0]


@pytest.mark.parametrize("stream", [True, False], ids=["streaming", "non-streaming"])
async def test_an_index_written_twice_reaches_the_client_once(
    start_api: StartApi, redis: Redis, stream: bool
) -> None:
    api = await start_api(accept_models="mock")
    body = {"model": "mock", "prompt": "p", "max_tokens": 10, "stream": stream}
    first_seen = asyncio.Event()

    async def streamed(client: httpx.AsyncClient) -> list[Any]:
        chunks: list[Any] = []
        async with client.stream("POST", "/v1/completions", json=body) as r:
            async for frame in frames(r):
                if frame.data == "[DONE]":
                    return chunks
                chunks.append(frame.json())
                first_seen.set()
        raise AssertionError("the stream did not end with [DONE]")

    async with api.client() as client:
        if stream:
            answer = asyncio.create_task(streamed(client))
            rid = await only_request(redis)
            await write(redis, rid, FIRST)
            async with asyncio.timeout(10):
                await first_seen.wait()
            await write(redis, rid, OVERLAPS)
            chunks = await answer
            assert not [c for c in chunks if "error" in c]
            text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
        else:
            post = asyncio.create_task(client.post("/v1/completions", json=body))
            rid = await only_request(redis)
            await write(redis, rid, FIRST + OVERLAPS)
            r = await post
            assert r.status_code == 200, r.text
            text = r.json()["choices"][0]["text"]
    assert text == "".join(WORDS)
