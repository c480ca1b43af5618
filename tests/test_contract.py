"""The OpenAI contract as clients use it: strict types, nulls, retry advice, finish
reasons clients know, text-only errors, ``models.retrieve``, the OpenAPI document."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from redis.asyncio import Redis

from llmq.protocol.streams import lifecycle_entries
from tests.support.exposition import value
from tests.support.native import post_request, wait_status
from tests.support.servers import RunningApi, StartApi, StartWorker
from tests.support.sse import frames, openai_chunks
from tests.support.waiting import wait_until

CHAT = [{"role": "user", "content": "hello there"}]


def sdk(api: RunningApi, **kwargs: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=api.url + "/v1", api_key="unused", **kwargs)


async def queued_count(redis: Redis) -> int:
    """How many requests were ever accepted: the lifecycle stream's ``queued`` entries."""
    entries = await lifecycle_entries(redis)
    return sum(1 for _, fields in entries if fields["event"] == "queued")


async def test_nullable_fields_accept_null(stack: RunningApi) -> None:
    nulls = {
        k: None
        for k in ("temperature", "top_p", "n", "stream", "seed", "max_tokens", "stop", "user")
    }
    async with stack.client() as client:
        r = await client.post(
            "/v1/completions",
            json={"model": "mock", "prompt": "hi", **nulls, "stream_options": None},
        )
        chat = await client.post(
            "/v1/chat/completions",
            json={
                "model": "mock",
                "messages": CHAT,
                **nulls,
                "max_completion_tokens": None,
                "tools": None,
                "tool_choice": None,
                "response_format": None,
                "logprobs": None,
                "priority": None,
            },
        )
    assert r.status_code == 200, r.text
    assert chat.status_code == 200, chat.text
    assert r.json()["usage"]["completion_tokens"] == 128  # the default max_tokens


async def test_errors_quote_configured_limits_and_name_a_missing_content_type(
    start_api: StartApi, start_worker: StartWorker
) -> None:
    await start_worker()
    api = await start_api(min_priority=-7, max_priority=9)
    async with api.client() as client:
        low = await client.post(
            "/v1/completions", json={"model": "mock", "prompt": "x", "priority": -(10**12)}
        )
        bare = await client.post(
            "/v1/completions",
            content=b'{"model": "mock", "prompt": "x"}',
            headers={"content-type": ""},
        )
    assert low.status_code == 400
    assert low.json()["error"]["message"] == "priority must be between -7 and 9"
    assert bare.status_code == 400
    assert "Content-Type: application/json" in bare.json()["error"]["message"]
    assert "valid dictionary" not in bare.json()["error"]["message"]


async def test_every_error_says_whether_to_retry(
    start_api: StartApi, start_worker: StartWorker
) -> None:
    """429 and 503 invite a retry (with Retry-After); a 4xx or a timeout does not."""
    api = await start_api(max_queue_depth=1, accept_models="parked")
    async with api.client() as client:
        no_worker = await client.post("/v1/completions", json={"model": "mock", "prompt": "x"})
        first = await client.post("/v1/requests", json={"model": "parked", "prompt": "x"})
        full = await client.post("/v1/requests", json={"model": "parked", "prompt": "x"})
        bad = await client.post("/v1/completions", json={"model": "mock", "prompt": 3})
        missing = await client.get("/v1/nowhere")
    assert first.status_code == 202
    for r, status, retry in [
        (no_worker, 503, "true"),
        (full, 429, "true"),
        (bad, 400, "false"),
        (missing, 404, "false"),
    ]:
        assert r.status_code == status, r.text
        assert r.headers["x-should-retry"] == retry
        assert ("retry-after" in r.headers) == (retry == "true")


async def test_a_generation_timeout_is_not_resent_by_the_sdk(
    stack: RunningApi, redis: Redis
) -> None:
    """The SDK retries 5xx twice by default; a 504 must stay one accepted request."""
    client = sdk(stack)  # max_retries=2, the SDK's default
    with pytest.raises(openai.InternalServerError) as caught:
        await client.completions.create(
            model="mock", prompt="x", max_tokens=400, extra_body={"generation_timeout": 0.2}
        )
    await client.close()
    assert caught.value.status_code == 504
    assert await queued_count(redis) == 1  # three without the header
    assert caught.value.response.headers["x-should-retry"] == "false"


async def test_cancelled_and_timed_out_choices_end_with_abort(
    stack: RunningApi, redis: Redis
) -> None:
    """Clients know ``abort`` (vLLM's); llmq's own reason rides in an extension field."""
    async with stack.client() as client:
        async with client.stream(
            "POST",
            "/v1/chat/completions",
            json={"model": "mock", "messages": CHAT, "max_tokens": 400, "stream": True},
        ) as r:
            chunks: list[Any] = []
            async for frame in frames(r):
                if frame.data.startswith("{"):
                    chunks.append(frame.json())
                    if len(chunks) == 3:  # role + two tokens: it runs
                        rid = chunks[0]["id"].removeprefix("chatcmpl-")
                        await client.delete(f"/v1/requests/{rid}")
        cancelled = chunks[-1]["choices"][0]
        async with client.stream(
            "POST",
            "/v1/completions",
            json={
                "model": "mock",
                "prompt": "x",
                "max_tokens": 400,
                "stream": True,
                "generation_timeout": 0.2,
            },
        ) as r:
            timed_out = await openai_chunks(r)
    assert cancelled["finish_reason"] == "abort"
    assert cancelled["llmq_finish_reason"] == "cancelled"
    closing, error = timed_out[-2], timed_out[-1]
    assert closing["choices"][0]["finish_reason"] == "abort"
    assert closing["choices"][0]["llmq_finish_reason"] == "timeout"
    assert error["error"]["code"] == "generation_timeout"
    reasons = {c["choices"][0]["finish_reason"] for c in timed_out[:-1] if c.get("choices")}
    assert reasons <= {None, "abort"}


async def test_an_image_part_is_refused_as_text_only(stack: RunningApi, redis: Redis) -> None:
    client = sdk(stack)
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(
            model="mock",
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is this?"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}},
                    ],
                }
            ],
        )
    await client.close()
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["code"] == "unsupported_parameter"
    assert "text only" in error["message"] and "image_url" in error["message"]
    assert error["param"] == "messages[0].content"
    assert await queued_count(redis) == 0


async def test_models_retrieve(stack: RunningApi) -> None:
    client = sdk(stack)
    model = await client.models.retrieve("mock")
    with pytest.raises(openai.NotFoundError):
        await client.models.retrieve("nope")
    await client.close()
    assert model.id == "mock" and model.object == "model" and model.owned_by == "llmq"


async def test_agent_history_with_tool_messages_is_accepted(stack: RunningApi) -> None:
    """An agent's second turn: an assistant tool call (content null) and its result."""
    client = sdk(stack)
    reply = await client.chat.completions.create(
        model="mock",
        max_tokens=3,
        messages=[
            {"role": "user", "content": "weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ],
    )
    await client.close()
    assert reply.choices[0].finish_reason == "length"


async def test_openapi_documents_what_the_api_answers(stack: RunningApi) -> None:
    async with stack.client() as client:
        doc = (await client.get("/openapi.json")).json()
    for path, item in doc["paths"].items():
        for operation in item.values():
            assert "422" not in operation["responses"], path
    completions = doc["paths"]["/v1/completions"]["post"]["responses"]
    assert {"200", "400", "401", "404", "413", "429", "503", "504"} <= set(completions)
    assert "text/event-stream" in completions["200"]["content"]
    error = completions["429"]["content"]["application/json"]["schema"]
    assert error["$ref"].endswith("/ErrorBody")
    assert "/v1/models/{model}" in doc["paths"]


async def test_unknown_route_errors_are_not_retried(stack: RunningApi) -> None:
    async with httpx.AsyncClient(base_url=stack.url) as client:
        r = await client.delete("/v1/models")
    assert r.status_code == 405
    assert r.headers["x-should-retry"] == "false"


async def test_a_queue_full_answer_is_retried_then_served(
    start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    """x-should-retry: true on a 429: the SDK's own retry gets through once room frees."""
    await start_worker(concurrency=1)
    api = await start_api(max_queue_depth=1)
    async with api.client() as client:
        running = await client.post(
            "/v1/requests", json={"model": "mock", "prompt": "x", "max_tokens": 150}
        )
        await wait_status(client, running.json()["id"], "running", timeout=10)
        await client.post("/v1/requests", json={"model": "mock", "prompt": "x", "max_tokens": 2})
        client_sdk = sdk(api, max_retries=5)
        done = await client_sdk.completions.create(model="mock", prompt="x", max_tokens=2)
        await client_sdk.close()

        async def refused() -> bool:
            text = (await client.get("/metrics")).text
            return value(text, "llmq_requests_total", finished_reason="rejected") >= 1

        await wait_until(refused, timeout=5, what="the 429 to be counted")
    assert done.choices[0].finish_reason == "length"
    assert await queued_count(redis) == 3  # the refused attempts left nothing


async def test_native_requests_count_in_the_latency_histograms(stack: RunningApi) -> None:
    """A native request read from the start is timed as an OpenAI one is (TTFT, e2e).

    The API and the worker flush their metrics separately, so the wait is for the
    API's histograms themselves. The resumed read comes before the last request: a
    flush that carries the last request's timing carries the resumed read's too, so
    a resumed read that were counted would show here as a fourth.
    """
    async with stack.client() as client:
        for i in range(3):
            rid = await post_request(client, max_tokens=3)
            async with client.stream("GET", f"/v1/requests/{rid}/events") as r:
                async for _line in r.aiter_lines():
                    pass
            if i == 0:  # a resumed read is not counted again
                url = f"/v1/requests/{rid}/events?last_event_id=1-0"
                async with client.stream("GET", url) as r:
                    async for _line in r.aiter_lines():
                        pass

        async def counted() -> bool:
            text = (await client.get("/metrics")).text
            return (
                value(text, "llmq_requests_total") >= 3
                and value(text, "llmq_time_to_first_token_seconds_count", model="mock") >= 3
                and value(text, "llmq_e2e_request_latency_seconds_count", model="mock") >= 3
            )

        await wait_until(counted, timeout=10, what="the requests to be counted")
        text = (await client.get("/metrics")).text
    assert value(text, "llmq_requests_total") == 3
    assert value(text, "llmq_time_to_first_token_seconds_count", model="mock") == 3
    assert value(text, "llmq_e2e_request_latency_seconds_count", model="mock") == 3
