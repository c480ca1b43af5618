"""A request's whole path, in process: real uvicorn, real worker, real Redis."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from api.streams import fanin
from llmq.model.tokenizer import count_tokens
from llmq.protocol import keys
from tests.support.native import post_request, wait_status
from tests.support.servers import RunningApi, StartApi
from tests.support.sse import frames, openai_chunks
from tests.support.waiting import wait_until


async def test_streaming_completion(stack: RunningApi) -> None:
    body = {
        "model": "mock",
        "prompt": "say something",
        "max_tokens": 12,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with stack.client() as client, client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        chunks = await openai_chunks(r)
    texts = [c["choices"][0]["text"] for c in chunks if c["choices"]]
    # tokens published together come in one chunk: the twelve tokens, in however many
    assert count_tokens("".join(texts)) == 12, texts
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 2, "completion_tokens": 12, "total_tokens": 14}
    assert all(c["object"] == "text_completion" and c["id"].startswith("cmpl-") for c in chunks)


async def test_streaming_chat_without_usage(stack: RunningApi) -> None:
    body = {
        "model": "mock",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 5,
        "stream": True,
    }
    async with (
        stack.client() as client,
        client.stream("POST", "/v1/chat/completions", json=body) as r,
    ):
        chunks = await openai_chunks(r)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    contents = [c["choices"][0]["delta"].get("content") for c in chunks[1:-1]]
    # tokens published together (a worker catching up on a loaded machine) come in one
    # chunk: the five tokens, in however many chunks
    assert all(contents) and count_tokens("".join(contents)) == 5, contents
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all("usage" not in c for c in chunks)


async def test_non_streaming_is_deterministic_per_seed(stack: RunningApi) -> None:
    body = {"model": "mock", "prompt": "one two three", "max_tokens": 8, "seed": 42}
    async with stack.client() as client:
        first = (await client.post("/v1/completions", json=body)).json()
        second = (await client.post("/v1/completions", json=body)).json()
    assert first["object"] == "text_completion"
    assert first["usage"] == {"prompt_tokens": 3, "completion_tokens": 8, "total_tokens": 11}
    assert first["choices"][0]["text"] == second["choices"][0]["text"]
    assert len(first["choices"][0]["text"].split()) == 8


async def test_non_streaming_chat(stack: RunningApi) -> None:
    body = {"model": "mock", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    async with stack.client() as client:
        r = await client.post("/v1/chat/completions", json=body)
    data = r.json()
    assert r.status_code == 200
    assert data["object"] == "chat.completion"
    assert data["choices"][0]["message"]["role"] == "assistant"
    assert data["choices"][0]["finish_reason"] == "length"
    assert data["usage"]["completion_tokens"] == 3


async def test_models_health_and_workers(stack: RunningApi) -> None:
    async with stack.client() as client:
        models = (await client.get("/v1/models")).json()
        health = await client.get("/healthz")
        workers = (await client.get("/v1/workers")).json()["data"]
    assert [m["id"] for m in models["data"]] == ["mock"]
    assert health.json() == {"status": "ok"}
    assert len(workers) == 1 and workers[0]["model"] == "mock" and workers[0]["concurrency"] == 8


async def test_readyz_without_workers(start_api: StartApi) -> None:
    api = await start_api()
    async with api.client() as client:
        r = await client.get("/readyz")
        models = (await client.get("/v1/models")).json()
        refused = await client.post("/v1/completions", json={"model": "mock", "prompt": "x"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "no_workers"
    assert models["data"] == []
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"


async def test_native_request_status_and_events(stack: RunningApi, redis: Redis) -> None:
    async with stack.client() as client:
        created = await client.post(
            "/v1/requests", json={"model": "mock", "prompt": "a b c d", "max_tokens": 6}
        )
        assert created.status_code == 202
        rid = created.json()["id"]
        async with client.stream("GET", f"/v1/requests/{rid}/events") as r:
            got = [f async for f in frames(r)]
        status = (await client.get(f"/v1/requests/{rid}")).json()
    kinds = [f.event for f in got]
    assert kinds[0] == "started" and kinds[-1] == "done"
    tokens = [t for f in got if f.event == "tokens" for t in f.json()["tokens"]]
    assert len(tokens) == 6
    assert all(f.id and "-" in f.id for f in got)
    assert status["status"] == "done" and status["completion_tokens"] == 6
    assert status["finish_reason"] == "length" and status["queue_ms"] >= 0
    assert await redis.ttl(keys.stream(rid)) > 0
    assert await redis.ttl(keys.request(rid)) > 0


async def test_native_resume_with_last_event_id(stack: RunningApi) -> None:
    async with stack.client() as client:
        rid = (
            await client.post(
                "/v1/requests", json={"model": "mock", "prompt": "resume me", "max_tokens": 20}
            )
        ).json()["id"]
        url = f"/v1/requests/{rid}/events"
        async with client.stream("GET", url) as r:
            first: list[str] = []
            async for f in frames(r):
                first.append(f.id or "")
                if len(first) == 3:
                    break
        async with client.stream("GET", url, headers={"Last-Event-ID": first[-1]}) as r:
            rest = [f async for f in frames(r)]
        async with client.stream("GET", url) as r:
            everything = [f async for f in frames(r)]
    assert [f.id for f in everything] == first + [f.id for f in rest]
    assert rest[-1].event == "done"


async def test_unknown_request_is_404(stack: RunningApi) -> None:
    async with stack.client() as client:
        status = await client.get("/v1/requests/" + "0" * 32)
        events = await client.get("/v1/requests/" + "0" * 32 + "/events")
        bad_resume = await client.get(
            "/v1/requests/x/events", headers={"Last-Event-ID": "not-an-id"}
        )
    assert status.status_code == 404 and status.json()["error"]["code"] == "request_not_found"
    assert events.status_code == 404
    assert bad_resume.status_code == 400


async def test_a_record_that_lost_its_creation_is_reported_missing(
    stack: RunningApi, redis: Redis
) -> None:
    """A failover can lose the writes that created a record while later ones land:
    what is left (no id, model, owner, creation time) is 404 with why, never a 500."""
    async with stack.client() as client:
        rid = await post_request(client, "a b c", max_tokens=3)
        await wait_status(client, rid, "done")
    key = keys.request(rid)
    left = {"status", "finish_reason", "completion_tokens"}
    await redis.hdel(key, *(set(await redis.hkeys(key)) - left))  # type: ignore[misc]
    async with stack.client() as client:
        answers = [
            await client.get(f"/v1/requests/{rid}"),
            await client.get(f"/v1/requests/{rid}/events"),
            await client.delete(f"/v1/requests/{rid}"),
        ]
    for answer in answers:
        assert answer.status_code == 404, answer.text
        error = answer.json()["error"]
        assert error["code"] == "request_not_found" and "lost" in error["message"]


@pytest.mark.timeout(60)
@pytest.mark.slow
async def test_concurrent_streams_share_one_relay_connection(
    stack: RunningApi, redis: Redis
) -> None:
    """50 clients streaming at once do not open 50 blocking Redis connections."""
    body = {"model": "mock", "prompt": "go", "max_tokens": 20, "stream": True}

    async def one() -> int:
        async with (
            stack.client() as client,
            client.stream("POST", "/v1/completions", json=body) as r,
        ):
            chunks = await openai_chunks(r)
        # tokens ready together may share a chunk: count the words
        return len("".join(c["choices"][0]["text"] for c in chunks if c["choices"]).split())

    tasks = [asyncio.create_task(one()) for _ in range(50)]
    peak = 0
    while not all(t.done() for t in tasks):
        clients = await redis.client_list()
        # blocked in a command right now ("b"): a pooled connection whose last command
        # was an XREAD but that sits idle does not count
        peak = max(peak, sum(1 for c in clients if "b" in c.get("flags", "")))
        await asyncio.sleep(0.02)
    assert [t.result() for t in tasks] == [20] * 50
    assert peak == 1  # the relay's one XREAD, whatever the number of streams


async def test_a_stream_that_breaks_ends_with_an_error_chunk_and_done(
    stack: RunningApi, monkeypatch: pytest.MonkeyPatch, redis: Redis
) -> None:
    """After the status line, a failure in the API (here: injected into its stream
    reader) must end the stream as OpenAI does, not cut the connection."""

    async def broken(*args: object, **kwargs: object) -> AsyncIterator[object]:
        raise ConnectionError("No connection available.")
        yield  # an async generator

    monkeypatch.setattr(fanin, "follow", broken)
    body = {"model": "mock", "prompt": "p", "max_tokens": 50, "stream": True}
    async with stack.client() as client, client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        data = [f.data async for f in frames(r)]
    assert data[-1] == "[DONE]"
    error = json.loads(data[-2])["error"]
    assert error["code"] == "stream_failed" and error["type"] == "server_error"

    async def released() -> bool:
        return (
            int(await redis.zcard(keys.running("mock"))) == 0
            and not await redis.keys(keys.ATTACHED_PREFIX + "*")
        ) or False

    await wait_until(released, timeout=10, what="the request to be cancelled and detached")
