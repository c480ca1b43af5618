"""The floor server streams valid OpenAI chunks at the model's pace; through Redis, the same."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import uvicorn
from openai import AsyncOpenAI
from redis.asyncio import Redis

from bench.floor import FloorApp
from bench.floor_via_redis import Emitting, FloorViaRedis, UpstreamBackend, serve_model
from llmq.embedded import free_port
from rigs.llama import tiny_server
from tests.support.waiting import wait_until
from worker.mock import MockBackend

pytestmark = pytest.mark.timeout(60)

TOKENS_PER_SECOND = 50.0


def _model() -> MockBackend:
    return MockBackend(tokens_per_second=TOKENS_PER_SECOND, prefill_seconds_per_token=0.0)


@contextlib.asynccontextmanager
async def _serving(app: FloorApp) -> AsyncIterator[str]:
    """``app`` on a real uvicorn server in this event loop: its /v1 URL."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, lifespan="on")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    await wait_until(lambda: server.started, timeout=10, what="the server to start")
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        async with asyncio.timeout(10):
            await task


@pytest.fixture
async def floor_url() -> AsyncIterator[str]:
    async with _serving(FloorApp(_model())) as url:
        yield url


async def test_chat_stream_is_openai_shaped_and_paced(floor_url: str) -> None:
    client = AsyncOpenAI(base_url=floor_url, api_key="unused")
    arrivals: list[float] = []
    texts: list[str] = []
    finish: list[str | None] = []
    usage = None
    started = time.monotonic()
    stream = await client.chat.completions.create(
        model="mock",
        messages=[{"role": "user", "content": "Tell me a story"}],
        max_tokens=20,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in stream:
        assert chunk.object == "chat.completion.chunk" and chunk.id.startswith("chatcmpl-")
        if chunk.usage is not None:
            usage = chunk.usage
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        finish.append(choice.finish_reason)
        if choice.delta.content:
            arrivals.append(time.monotonic())
            texts.append(choice.delta.content)
    await client.close()
    assert len(texts) == 20 and all(t.startswith(" ") for t in texts)
    assert finish[-1] == "length" and all(f is None for f in finish[:-1])
    assert usage is not None and usage.completion_tokens == 20 and usage.prompt_tokens == 5
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    interval = 1.0 / TOKENS_PER_SECOND
    # On the model's schedule: no token sooner than its deadline (a loaded machine only
    # delays them, and one it delayed is followed by quicker ones, so single gaps are
    # not bounded), and not batched: the tokens came at many moments, not at one.
    assert all(at - started >= (k + 1) * interval * 0.9 for k, at in enumerate(arrivals))
    assert sum(gap > 0.001 for gap in gaps) >= 5, gaps


async def test_completion_without_stream(floor_url: str) -> None:
    client = AsyncOpenAI(base_url=floor_url, api_key="unused")
    started = time.monotonic()
    completion = await client.completions.create(model="mock", prompt="Once upon", max_tokens=5)
    elapsed = time.monotonic() - started
    await client.close()
    assert completion.object == "text_completion"
    assert completion.choices[0].finish_reason == "length"
    assert len(completion.choices[0].text.split()) == 5
    assert completion.usage is not None and completion.usage.completion_tokens == 5
    assert elapsed >= 5 / TOKENS_PER_SECOND * 0.9


@contextlib.asynccontextmanager
async def _via_redis(
    redis_url: str, role: str, apart: Emitting | None = None, **options: Any
) -> AsyncIterator[str]:
    """The floor via Redis; with ``role`` "api", its model (``apart``, else the mock)
    served apart (``serve_model``)."""
    app = FloorViaRedis(_model(), redis_url, role="api" if role == "api" else "both", **options)
    stop = asyncio.Event()
    model = None
    if role == "api":
        served = apart or _model()
        model = asyncio.create_task(serve_model(served, redis_url, stop=stop, **options))
    try:
        async with _serving(app) as url:
            yield url
    finally:
        stop.set()
        if model is not None:
            async with asyncio.timeout(10):
                await model


async def _sse_events(url: str, path: str, body: dict[str, Any]) -> list[Any]:
    """The ``data:`` payloads of one streamed response, parsed, without id and creation time
    (random per response); the last one is ``[DONE]``."""
    async with (
        httpx.AsyncClient(base_url=url, timeout=10) as client,
        client.stream("POST", path, json=body) as response,
    ):
        assert response.status_code == 200
        raw = (await response.aread()).decode()
    events = [e.removeprefix("data: ") for e in raw.split("\n\n") if e]
    parsed: list[Any] = [json.loads(e) for e in events[:-1]]
    for event in parsed:
        del event["id"], event["created"]
    return [*parsed, events[-1]]


def _text(event: dict[str, Any]) -> str:
    choice = event["choices"][0] if event["choices"] else {}
    return str(choice.get("text") or choice.get("delta", {}).get("content") or "")


@pytest.mark.parametrize("role", ["both", "api"])
@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
async def test_via_redis_streams_exactly_the_floors_chunks(
    floor_url: str, redis_url: str, role: str, path: str
) -> None:
    body: dict[str, Any] = {
        "model": "mock",
        "max_tokens": 25,
        "seed": 7,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if path == "/chat/completions":
        body["messages"] = [{"role": "user", "content": "Tell me a story"}]
    else:
        body["prompt"] = "Once upon a time"
    floor = await _sse_events(floor_url, path, body)
    async with _via_redis(redis_url, role) as url:
        relayed = await _sse_events(url, path, body)
    assert relayed == floor
    assert floor[-1] == "[DONE]"
    assert sum(1 for event in floor[:-1] if _text(event)) == 25


async def test_via_redis_tokens_pass_through_bounded_expiring_streams(
    redis_url: str, redis: Redis
) -> None:
    texts: list[str] = []
    async with _via_redis(redis_url, "both", prefix="hop", maxlen=8, ttl=30) as url:
        client = AsyncOpenAI(base_url=url, api_key="unused")
        stream = await client.completions.create(
            model="mock", prompt="Once upon", max_tokens=20, stream=True
        )
        response_id = ""
        async for chunk in stream:
            response_id = chunk.id
            texts.extend(c.text for c in chunk.choices if c.text)
        await client.close()
    assert len(texts) == 20
    key = f"hop:s:{response_id}"
    entries = await redis.xrange(key)
    # Bounded: only the last 8 entries are kept, the tokens' and then the end's.
    assert [fields for _, fields in entries] == [{"t": t} for t in texts[-7:]] + [{"d": "1"}]
    assert 0 < await redis.ttl(key) <= 30
    assert set(await redis.keys("hop:*")) <= {key, "hop:control"}
    assert await redis.xlen("hop:control") <= 1


@pytest.mark.timeout(120)
@pytest.mark.engine
async def test_via_redis_in_front_of_an_inference_server_relays_its_text(redis_url: str) -> None:
    """``--upstream``: the model's process streams from a real llama-server, and the
    client gets, through Redis, the text the server gives directly."""
    prompt = "hello world " * 4
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 0}
    with tiny_server(1) as upstream:
        async with httpx.AsyncClient(base_url=upstream, timeout=30) as client:
            direct = (await client.post("/v1/completions", json=body)).json()
        expected = direct["choices"][0]["text"]
        upstream_model = UpstreamBackend(upstream)
        try:
            async with _via_redis(redis_url, "api", upstream_model) as url:
                sdk = AsyncOpenAI(base_url=url, api_key="unused")
                stream = await sdk.completions.create(
                    model="tiny", prompt=prompt, max_tokens=12, temperature=0, stream=True
                )
                texts = [c.text async for chunk in stream for c in chunk.choices if c.text]
                await sdk.close()
        finally:
            await upstream_model.aclose()
    assert expected and "".join(texts) == expected
    assert len(texts) == direct["usage"]["completion_tokens"]
