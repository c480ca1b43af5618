"""OpenAI requests are attached to their API process's liveness; native ones are not."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import cast

import pytest
from redis.asyncio import Redis

from llmq.protocol import keys
from tests.support.native import post_request, wait_status
from tests.support.servers import RunningApi, StartApi
from tests.support.sse import frames
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


async def attached(redis: Redis, api: RunningApi) -> set[str]:
    process_id = api.app_state().process_id
    return await cast("Awaitable[set[str]]", redis.smembers(keys.attached(process_id)))


async def test_an_openai_request_is_attached_while_its_client_is_there(
    stack: RunningApi, redis: Redis
) -> None:
    body = {"model": "mock", "prompt": "hold on", "max_tokens": 500, "stream": True}  # seconds
    async with stack.client() as client:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            async for frame in frames(r):
                rid = frame.json()["id"].removeprefix("cmpl-")
                assert await attached(redis, stack) == {f"{rid}:mock"}
                break
        r2 = await client.post(
            "/v1/chat/completions",
            json={
                "model": "mock",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 2,
            },
        )
        assert r2.status_code == 200, r2.text
        native = await post_request(client, max_tokens=2)
        await wait_status(client, native, "done")

    async def detached() -> bool:
        return not await attached(redis, stack)

    await wait_until(detached, timeout=5, what="both OpenAI requests to detach")


async def test_a_stopping_api_leaves_its_attached_requests_to_the_sweep(
    start_api: StartApi, redis: Redis
) -> None:
    """Whatever is still attached when an API process stops is cancelled, then the
    process is forgotten; no key is left behind."""
    survivor = await start_api(accept_models="mock")
    leaving = await start_api(accept_models="mock")
    process_id = leaving.app_state().process_id
    # a request attached to `leaving` whose client never detaches (no worker runs it)
    await cast("Awaitable[int]", redis.sadd(keys.attached(process_id), "0123abcd:mock"))
    await redis.zadd(keys.queue("mock"), {"0123abcd": 1})
    leaving.server.should_exit = True
    await leaving.task

    async def forgotten() -> bool:
        return (
            not await redis.exists(keys.attached(process_id))
            and await redis.zscore(keys.APIS, process_id) is None
        )

    # sooner than its lease (orphan_grace_seconds, 5 s) would have run out by itself
    await wait_until(forgotten, timeout=3, what="the stopped API process to be forgotten")
    assert await redis.zcard(keys.queue("mock")) == 0, "its request was not cancelled"
    assert await redis.zscore(keys.APIS, survivor.app_state().process_id) is not None
