"""A stream that fails mid-way ends cleanly: the tokens so far, an error chunk, [DONE].

The failure is injected into the API's stream reader after real tokens from a real
worker reached the client, so the path under test is the one after the first
event, where the status line and some chunks are already sent.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from api.state import AppState
from api.streams import fanin
from api.streams.follow import Batch
from api.streams.follow import follow as real_follow
from llmq.protocol import keys
from llmq.schema import TokensEvent
from tests.support.servers import RunningApi
from tests.support.sse import frames
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(30)

#: Token events relayed before the reader breaks.
BREAK_AFTER = 3


async def test_a_stream_that_fails_mid_way_ends_with_an_error_chunk_and_done(
    stack: RunningApi, monkeypatch: pytest.MonkeyPatch, redis: Redis
) -> None:
    async def breaks_mid_way(
        state: AppState, request_id: str, last_id: str = "0-0"
    ) -> AsyncIterator[Batch | None]:
        relayed = 0
        async for batch in real_follow(state, request_id, last_id):
            # Break right after the BREAK_AFTER-th token event, even when the rest of
            # the request arrived in the same batch.
            for i, (_, event) in enumerate(batch or ()):
                if isinstance(event, TokensEvent):
                    relayed += 1
                    if relayed == BREAK_AFTER:
                        yield (batch or [])[: i + 1]
                        raise ConnectionError("No connection available.")
            yield batch

    monkeypatch.setattr(fanin, "follow", breaks_mid_way)
    body = {"model": "mock", "prompt": "p", "max_tokens": 200, "stream": True}
    async with stack.client() as client, client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        data = [f.data async for f in frames(r)]
    assert data[-1] == "[DONE]"
    chunks: list[Any] = [json.loads(d) for d in data[:-1]]
    texts = [c["choices"][0]["text"] for c in chunks[:-1]]
    assert len(texts) >= BREAK_AFTER and all(texts), "tokens before the failure reach the client"
    error = chunks[-1]["error"]
    assert error["code"] == "stream_failed" and error["type"] == "server_error"
    (rid,) = [k.split(":")[-1] for k in await redis.keys(keys.REQUESTS_GLOB)]

    async def cancelled() -> bool:
        status = await redis.hget(keys.request(rid), "status")  # type: ignore[misc]
        return status == "cancelled" and not await redis.keys(keys.ATTACHED_PREFIX + "*")

    await wait_until(cancelled, timeout=10, what="the broken stream's request to be cancelled")

    async def released() -> bool:  # the worker stops the run after the cancel lands
        return int(await redis.zcard(keys.running("mock"))) == 0

    await wait_until(released, timeout=5, what="the worker to release the cancelled run")
