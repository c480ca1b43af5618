"""``llmq run --workers 2`` as real processes, driven as a user would."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator

import httpx
import openai
import pytest

from llmq.embedded import free_port
from loadgen.sse import Frame
from tests.support.processes import (
    Proc,
    alive,
    children_of,
    clean_env,
    live_workers,
    reap,
    wait_for,
)
from tests.support.sse import frames

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[str, Proc]]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = Proc(
        ["run", "--workers", "2", "--concurrency", "16", "--port", str(port)],
        clean_env(LLMQ_MODEL_TOKENS_PER_SECOND="100"),
    )
    kids: list[int] = []
    try:
        wait_for(lambda: live_workers(url) == 2, 60, "two live workers", proc)
        kids = children_of(proc.pid)
        yield url, proc
    finally:
        proc.stop()
        reap(kids)


def test_openai_sdk_streams_chat_and_completion(stack: tuple[str, Proc]) -> None:
    url, _ = stack
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    chat = client.chat.completions.create(
        model="mock",
        messages=[{"role": "user", "content": "Tell me a story"}],
        max_tokens=10,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(chat)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(content.split()) == 10
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 10
    stream = client.completions.create(model="mock", prompt="Once upon", max_tokens=7, stream=True)
    texts = [c.choices[0].text for c in stream]
    assert len("".join(texts).split()) == 7
    full = client.completions.create(model="mock", prompt="Once upon", max_tokens=4)
    assert full.usage is not None and full.usage.completion_tokens == 4
    assert [m.id for m in client.models.list()] == ["mock"]


async def test_openai_async_sdk(stack: tuple[str, Proc]) -> None:
    url, _ = stack
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused")
    reply = await client.chat.completions.create(
        model="mock", messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 3
    stream = await client.completions.create(model="mock", prompt="go", max_tokens=5, stream=True)
    assert len([c async for c in stream if c.choices and c.choices[0].text]) == 5
    await client.close()


async def test_twenty_concurrent_streams(stack: tuple[str, Proc]) -> None:
    url, _ = stack
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused")

    async def one(n: int) -> tuple[int, int | None]:
        stream = await client.completions.create(
            model="mock",
            prompt=f"request {n}",
            max_tokens=10 + n,
            stream=True,
            stream_options={"include_usage": True},
        )
        tokens, usage = 0, None
        async for chunk in stream:
            if chunk.choices:
                tokens += len(chunk.choices[0].text.split())
            if chunk.usage:
                usage = chunk.usage.completion_tokens
        return tokens, usage

    results = await asyncio.gather(*(one(n) for n in range(20)))
    await client.close()
    assert results == [(10 + n, 10 + n) for n in range(20)]
    async with httpx.AsyncClient(base_url=url) as http:
        workers = (await http.get("/v1/workers")).json()["data"]
    assert len(workers) == 2


async def test_native_stream_cut_and_resumed(stack: tuple[str, Proc]) -> None:
    url, _ = stack
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        rid = (
            await http.post(
                "/v1/requests", json={"model": "mock", "prompt": "resume", "max_tokens": 30}
            )
        ).json()["id"]
        seen: list[Frame] = []
        async with http.stream("GET", f"/v1/requests/{rid}/events") as r:
            async for frame in frames(r):
                seen.append(frame)
                if len(seen) == 4:
                    break
        assert seen[-1].id is not None
        headers = {"Last-Event-ID": seen[-1].id}
        async with http.stream("GET", f"/v1/requests/{rid}/events", headers=headers) as r:
            resumed = [frame async for frame in frames(r)]
    events = [f.json() for f in seen + resumed]
    ids = [f.id for f in seen + resumed]
    assert len(set(ids)) == len(ids), "an event was repeated"
    assert events[-1]["type"] == "done"
    tokens = [e for e in events if e["type"] == "tokens"]
    indexes = [i for e in tokens for i in range(e["index"], e["index"] + len(e["tokens"]))]
    assert indexes == list(range(30)), "tokens lost or repeated across the reconnect"


def test_ctrl_c_stops_everything() -> None:
    """SIGINT to ``llmq run`` stops API, workers and the embedded Redis."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = Proc(["run", "--workers", "2", "--port", str(port)], clean_env())
    kids: list[int] = []
    try:
        wait_for(lambda: live_workers(url) == 2, 60, "two live workers", proc)
        kids = children_of(proc.pid)
        assert len(kids) == 4, kids  # redis-server, api, two workers
        proc.signal(signal.SIGINT)
        assert proc.wait(30) == 0
        wait_for(lambda: not any(alive(k) for k in kids), 10, "children to exit")
        out = proc.output()
        assert "[api]" in out and "[worker-1]" in out and "[worker-2]" in out
        assert "llmq stopped" in out
    finally:
        proc.stop()
        reap(kids)
