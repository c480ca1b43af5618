"""The floor server streams valid OpenAI chunks at the model's pace."""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from collections.abc import AsyncIterator

import pytest
import uvicorn
from openai import AsyncOpenAI

from bench.floor import FloorApp
from llmq.embedded import free_port
from tests.support.waiting import wait_until
from worker.model import MockModel

TOKENS_PER_SECOND = 50.0


@pytest.fixture
async def floor_url() -> AsyncIterator[str]:
    port = free_port()
    model = MockModel(tokens_per_second=TOKENS_PER_SECOND, prefill_seconds_per_token=0.0)
    config = uvicorn.Config(
        FloorApp(model), host="127.0.0.1", port=port, log_config=None, lifespan="on"
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    await wait_until(lambda: server.started, timeout=10, what="the floor to start")
    yield f"http://127.0.0.1:{port}/v1"
    server.should_exit = True
    async with asyncio.timeout(10):
        await task


async def test_chat_stream_is_openai_shaped_and_paced(floor_url: str) -> None:
    client = AsyncOpenAI(base_url=floor_url, api_key="unused")
    arrivals: list[float] = []
    texts: list[str] = []
    finish: list[str | None] = []
    usage = None
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
    # On the model's schedule: neither batched (gaps near 0) nor slower than the model.
    assert 0.75 * interval <= statistics.median(gaps) <= 1.5 * interval
    assert arrivals[-1] - arrivals[0] >= 19 * interval * 0.9


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
