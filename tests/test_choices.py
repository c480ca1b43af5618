"""``n`` > 1 and prompt lists: one request per choice, every choice in the response
with its index, usage summed, admission all or none, a disconnect cancels all."""

from __future__ import annotations

import signal
from collections import defaultdict
from typing import Any

import httpx
import openai
import pytest
from redis.asyncio import Redis

from llmq.protocol import keys
from tests.support.native import record, wait_status
from tests.support.servers import RunningApi, SpawnWorkers, StartApi, StartWorker
from tests.support.sse import frames, openai_chunks


def sdk(api: RunningApi) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=api.url + "/v1", api_key="unused")


async def request_ids(redis: Redis) -> list[str]:
    return [k.rsplit(":", 1)[-1] async for k in redis.scan_iter(keys.REQUESTS_GLOB)]


async def test_prompt_list_times_n_gives_every_choice_with_its_index(
    stack: RunningApi, redis: Redis
) -> None:
    client = sdk(stack)
    reply = await client.completions.create(
        model="mock", prompt=["one two", "three", "four five six"], n=2, max_tokens=5, seed=3
    )
    await client.close()
    assert [c.index for c in reply.choices] == list(range(6))
    assert all(c.finish_reason == "length" for c in reply.choices)
    assert len({c.text for c in reply.choices}) == 6  # each choice its own seed
    assert reply.usage is not None
    # each prompt's tokens once, every choice's completion
    assert reply.usage.prompt_tokens == 2 + 1 + 3
    assert reply.usage.completion_tokens == 6 * 5
    assert len(await request_ids(redis)) == 6


async def test_streamed_choices_are_relayed_together(stack: RunningApi, redis: Redis) -> None:
    async with stack.client() as client:
        async with client.stream(
            "POST",
            "/v1/chat/completions",
            json={
                "model": "mock",
                "messages": [{"role": "user", "content": "hi"}],
                "n": 3,
                "max_tokens": 8,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        ) as r:
            chunks = await openai_chunks(r)
    text: dict[int, str] = defaultdict(str)
    finish: dict[int, str] = {}
    roles = 0
    for chunk in chunks[:-1]:
        assert len({c["id"] for c in chunks}) == 1
        (choice,) = chunk["choices"]
        roles += choice["delta"].get("role") == "assistant"
        text[choice["index"]] += choice["delta"].get("content", "")
        if choice["finish_reason"]:
            finish[choice["index"]] = choice["finish_reason"]
    assert roles == 3
    assert finish == {0: "length", 1: "length", 2: "length"}
    assert all(len(t.split()) == 8 for t in text.values())
    assert chunks[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 24, "total_tokens": 27}
    async with stack.client() as client:
        records = [await record(client, i) for i in await request_ids(redis)]
    assert [r["status"] for r in records] == ["done"] * 3


async def test_choices_are_admitted_all_or_none(
    start_api: StartApi, redis: Redis, start_worker: StartWorker
) -> None:
    """A request whose choices do not all fit in the queue is refused whole (429)."""
    api = await start_api(max_queue_depth=3, accept_models="parked")
    async with api.client() as client:
        for _ in range(2):
            queued = await client.post("/v1/requests", json={"model": "parked", "prompt": "x"})
            assert queued.status_code == 202
        before = await redis.dbsize()
        refused = await client.post(
            "/v1/completions", json={"model": "parked", "prompt": ["a", "b"], "max_tokens": 2}
        )
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "queue_full"
    assert await redis.zcard(keys.queue("parked")) == 2
    assert await redis.dbsize() == before


async def test_a_disconnect_cancels_every_choice(stack: RunningApi, redis: Redis) -> None:
    async with stack.client() as client:
        async with client.stream(
            "POST",
            "/v1/completions",
            json={"model": "mock", "prompt": "x", "n": 3, "max_tokens": 2000, "stream": True},
        ) as r:
            async for frame in frames(r):
                if frame.data.startswith("{"):
                    break
        ids = await request_ids(redis)
        assert len(ids) == 3
        for i in ids:
            ended = await wait_status(client, i, "cancelled", "done", timeout=10)
            assert ended["status"] == "cancelled" and ended["completion_tokens"] < 2000


WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "minLength": 40}},
            "required": ["city"],
        },
    },
}


@pytest.mark.timeout(90)
@pytest.mark.slow
async def test_a_worker_killed_mid_tool_call_costs_one_choice_a_resume(
    start_api: StartApi, spawn_workers: SpawnWorkers, redis: Redis
) -> None:
    """Each choice recovers on its own: the streamed tool calls equal an undisturbed run's,
    each announced once, though one choice's worker died halfway through its arguments."""
    procs = await spawn_workers(2, concurrency=1, model_tokens_per_second=40, lease_seconds=1)
    api = await start_api()
    body: dict[str, Any] = {
        "model": "mock",
        "messages": [{"role": "user", "content": "weather?"}],
        "tools": [WEATHER],
        "tool_choice": "required",
        "n": 2,
        "seed": 7,
        "max_tokens": 200,
    }
    async with api.client() as client:
        expected = (await client.post("/v1/chat/completions", json=body)).json()["choices"]
        starts: dict[int, int] = defaultdict(int)
        arguments: dict[int, str] = defaultdict(str)
        finish: dict[int, str] = {}
        killed = False
        async with client.stream(
            "POST", "/v1/chat/completions", json={**body, "stream": True}
        ) as r:
            async for frame in frames(r):
                if frame.data == "[DONE]":
                    break
                chunk = frame.json()
                (choice,) = chunk["choices"]
                i = choice["index"]
                for call in choice["delta"].get("tool_calls", []):
                    starts[i] += "id" in call
                    arguments[i] += call["function"]["arguments"]
                if choice["finish_reason"]:
                    finish[i] = choice["finish_reason"]
                if not killed and len(arguments[0]) >= 12:
                    rid = chunk["id"].removeprefix("chatcmpl-")
                    worker = (await record(client, rid))["worker"]
                    next(p for p in procs if f"-{p.pid}-" in worker).signal(signal.SIGKILL)
                    killed = True
        records = [await record(client, i) for i in await request_ids(redis)]
    assert killed
    assert starts == {0: 1, 1: 1}
    assert finish == {0: "tool_calls", 1: "tool_calls"}
    for c in expected:
        assert arguments[c["index"]] == c["message"]["tool_calls"][0]["function"]["arguments"]
    resumed = [r for r in records if r["attempts"] == 2]
    assert len(resumed) == 1 and resumed[0]["status"] == "done"


async def test_a_non_streaming_client_that_leaves_cancels_every_choice(
    stack: RunningApi, redis: Redis
) -> None:
    async with stack.client(timeout=0.5) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post(
                "/v1/completions",
                json={"model": "mock", "prompt": ["x", "y"], "n": 2, "max_tokens": 2000},
            )
    async with stack.client() as client:
        ids = await request_ids(redis)
        assert len(ids) == 4
        for i in ids:
            ended = await wait_status(client, i, "cancelled", "done", timeout=10)
            assert ended["status"] == "cancelled" and ended["completion_tokens"] < 2000
