"""Structured output, tools, logprobs and length controls, end to end through the
openai SDK: honoured by the mock deterministically per seed, refused (400
``unsupported_parameter``) where the serving model cannot honour them."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from typing import Any

import jsonschema
import openai
import pytest
from redis.asyncio import Redis

from llmq.model.interface import GenerationRequest, Output, ToolCallStart
from llmq.model.json_subset import BUDGET, unsupported
from llmq.protocol import keys
from llmq.protocol.streams import lifecycle_entries
from llmq.schema import TokenLogprob, TokensEvent, decode_event, encode_event
from tests.support.native import wait_ready
from tests.support.servers import RunningApi, StartApi, StartWorker
from tests.support.waiting import wait_until
from worker.mock import MockBackend
from worker.structured import object_text

CHAT: list[Any] = [{"role": "user", "content": "answer in JSON"}]

PERSON: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 3, "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "score": {"type": "number"},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1},
        "active": {"type": "boolean"},
        "nickname": {"type": ["string", "null"]},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "tags", "address"],
    "additionalProperties": False,
}

WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
TIME: Any = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string"}},
            "required": ["zone"],
        },
    },
}
PARAMS: dict[str, Any] = {
    t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)
}


def sdk(api: RunningApi) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=api.url + "/v1", api_key="unused")


async def streamed_chat(client: openai.AsyncOpenAI, **kwargs: Any) -> dict[str, Any]:
    """Content, tool call and finish reason, assembled from the streamed deltas."""
    content, name, arguments, finish, call_id = "", None, "", None, None
    stream = await client.chat.completions.create(model="mock", stream=True, **kwargs)
    async for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                assert call.index == 0
                if call.id:
                    call_id, name = call.id, call.function and call.function.name
                arguments += (call.function and call.function.arguments) or ""
            finish = choice.finish_reason or finish
    return {
        "content": content,
        "name": name,
        "arguments": arguments,
        "finish": finish,
        "id": call_id,
    }


@pytest.mark.parametrize("stream", [False, True])
async def test_json_schema_output_validates_and_repeats_per_seed(
    fast: RunningApi, stream: bool
) -> None:
    client = sdk(fast)
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    texts = []
    for seed in (1, 1, 2, 3, 4):
        if stream:
            got = await streamed_chat(
                client, messages=CHAT, response_format=fmt, seed=seed, max_tokens=500
            )
            text, finish = got["content"], got["finish"]
        else:
            reply = await client.chat.completions.create(
                model="mock", messages=CHAT, response_format=fmt, seed=seed, max_tokens=500
            )
            text, finish = reply.choices[0].message.content or "", reply.choices[0].finish_reason
        assert finish == "stop"
        jsonschema.validate(json.loads(text), PERSON)
        texts.append(text)
    await client.close()
    assert texts[0] == texts[1] and len(set(texts)) >= 4


async def test_json_object_mode_answers_an_object(fast: RunningApi) -> None:
    client = sdk(fast)
    reply = await client.chat.completions.create(
        model="mock", messages=CHAT, response_format={"type": "json_object"}, max_tokens=200
    )
    await client.close()
    assert isinstance(json.loads(reply.choices[0].message.content or ""), dict)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_required_tool_choice_calls_a_tool_with_valid_arguments(
    fast: RunningApi, stream: bool
) -> None:
    client = sdk(fast)
    called = set()
    for seed in range(6):
        kwargs: Any = {
            "messages": CHAT,
            "tools": [WEATHER, TIME],
            "tool_choice": "required",
            "seed": seed,
            "max_tokens": 300,
        }
        if stream:
            got = await streamed_chat(client, **kwargs)
        else:
            reply = await client.chat.completions.create(model="mock", **kwargs)
            message = reply.choices[0].message
            assert message.content is None and message.tool_calls
            (call,) = message.tool_calls
            assert call.type == "function"
            got = {
                "name": call.function.name,
                "arguments": call.function.arguments,
                "finish": reply.choices[0].finish_reason,
                "id": call.id,
                "content": "",
            }
        assert got["finish"] == "tool_calls" and got["content"] == ""
        assert got["id"].startswith("call_")
        jsonschema.validate(json.loads(got["arguments"]), PARAMS[got["name"]])
        called.add(got["name"])
    await client.close()
    assert called == {"get_weather", "get_time"}


async def test_named_auto_and_none_tool_choices(fast: RunningApi) -> None:
    client = sdk(fast)
    named = await client.chat.completions.create(
        model="mock",
        messages=CHAT,
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=300,
    )
    calls = named.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_time"  # type: ignore[union-attr]
    none = await client.chat.completions.create(
        model="mock", messages=CHAT, tools=[WEATHER], tool_choice="none", max_tokens=5
    )
    assert none.choices[0].message.tool_calls is None
    assert none.choices[0].finish_reason == "length"
    auto = [
        await client.chat.completions.create(
            model="mock", messages=CHAT, tools=[WEATHER], seed=seed, max_tokens=100
        )
        for seed in range(8)
    ]
    await client.close()
    reasons = {r.choices[0].finish_reason for r in auto}
    assert reasons == {"tool_calls", "length"}  # the seed decides, both happen


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"$ref": "#/a"}},
                }
            },
            "response_format.json_schema.schema",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "x",
                        "schema": {"type": "string", "not": {"const": "a"}},
                    },
                }
            },
            "response_format.json_schema.schema",
        ),
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"anyOf": []}}}
                ]
            },
            "tools[0].function.parameters",
        ),
    ],
)
async def test_schema_features_the_mock_cannot_honour_are_refused(
    fast: RunningApi, redis: Redis, extra: dict[str, Any], param: str
) -> None:
    async with fast.client() as client:
        r = await client.post(
            "/v1/chat/completions", json={"model": "mock", "messages": CHAT, **extra}
        )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "unsupported_parameter"
    assert r.json()["error"]["param"] == param
    assert await redis.zcard(keys.queue("mock")) == 0


async def test_tool_choice_needs_a_matching_tool(fast: RunningApi) -> None:
    async with fast.client() as client:
        alone = await client.post(
            "/v1/chat/completions",
            json={"model": "mock", "messages": CHAT, "tool_choice": "required"},
        )
        unknown = await client.post(
            "/v1/chat/completions",
            json={
                "model": "mock",
                "messages": CHAT,
                "tools": [WEATHER],
                "tool_choice": {"type": "function", "function": {"name": "nope"}},
            },
        )
    assert alone.status_code == 400 and alone.json()["error"]["param"] == "tool_choice"
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "tool_choice"


@pytest.mark.parametrize("stream", [False, True])
async def test_chat_logprobs_are_per_token_and_repeat_per_seed(
    fast: RunningApi, stream: bool
) -> None:
    client = sdk(fast)
    runs = []
    for _ in range(2):
        if stream:
            stream_ = await client.chat.completions.create(
                model="mock",
                messages=CHAT,
                logprobs=True,
                top_logprobs=3,
                seed=5,
                max_tokens=6,
                stream=True,
            )
            entries = [
                e
                async for chunk in stream_
                for c in chunk.choices
                for e in ((c.logprobs and c.logprobs.content) or [])
            ]
            text = "".join(e.token for e in entries)
        else:
            reply = await client.chat.completions.create(
                model="mock", messages=CHAT, logprobs=True, top_logprobs=3, seed=5, max_tokens=6
            )
            logprobs = reply.choices[0].logprobs
            assert logprobs is not None and logprobs.content is not None
            entries = logprobs.content
            text = reply.choices[0].message.content or ""
        assert len(entries) == 6 and "".join(e.token for e in entries) == text
        for e in entries:
            assert e.logprob <= 0 and len(e.top_logprobs) == 3
            tops = [t.logprob for t in e.top_logprobs]
            assert tops == sorted(tops, reverse=True) and e.top_logprobs[0].token == e.token
        runs.append([(e.token, e.logprob) for e in entries])
    await client.close()
    assert runs[0] == runs[1]


async def test_completion_logprobs_use_the_legacy_shape(fast: RunningApi) -> None:
    client = sdk(fast)
    reply = await client.completions.create(model="mock", prompt="x", logprobs=2, max_tokens=4)
    await client.close()
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens and logprobs.top_logprobs
    assert "".join(logprobs.tokens) == reply.choices[0].text
    assert len(logprobs.token_logprobs or []) == 4
    assert all(len(top) == 2 for top in logprobs.top_logprobs)
    assert logprobs.text_offset == [
        0,
        *[sum(len(t) for t in logprobs.tokens[:i]) for i in range(1, 4)],
    ]


async def test_ignore_eos_and_min_tokens_hold_lengths(
    start_api: StartApi, start_worker: StartWorker
) -> None:
    """With a stop probability, lengths drift; ignore_eos and min_tokens pin them."""
    await start_worker(model_stop_probability=0.2, model_tokens_per_second=2000.0)
    api = await start_api()
    client = sdk(api)

    async def lengths(**extra: Any) -> list[int]:
        out = []
        for seed in range(8):
            reply = await client.completions.create(
                model="mock", prompt="x", max_tokens=40, seed=seed, extra_body=extra
            )
            assert reply.usage is not None
            out.append(reply.usage.completion_tokens)
        return out

    plain = await lengths()
    pinned = await lengths(ignore_eos=True)
    floor = await lengths(min_tokens=25)
    await client.close()
    assert min(plain) < 25  # the control: the mock does stop early
    assert pinned == [40] * 8
    assert min(floor) >= 25


class TextOnly:
    """A backend that declares no capabilities: plain text only."""

    def __init__(self) -> None:
        self.mock = MockBackend(tokens_per_second=500)

    def count_tokens(self, text: str) -> int:
        return self.mock.count_tokens(text)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Output]:
        async for token in self.mock.generate(request):
            yield token


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [WEATHER]}, "tools"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"logprobs": True}, "logprobs"),
        ({"ignore_eos": True}, "ignore_eos"),
        ({"min_tokens": 2}, "min_tokens"),
    ],
)
async def test_a_backend_without_a_capability_answers_400(
    start_api: StartApi, start_worker: StartWorker, redis: Redis, extra: dict[str, Any], param: str
) -> None:
    await start_worker(backend=TextOnly())
    api = await start_api()
    async with api.client() as client:
        await wait_ready(client)
        refused = await client.post(
            "/v1/chat/completions", json={"model": "mock", "messages": CHAT, **extra}
        )
        assert not await lifecycle_entries(redis)  # nothing was enqueued
        plain = await client.post(
            "/v1/chat/completions", json={"model": "mock", "messages": CHAT, "max_tokens": 2}
        )
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["code"] == "unsupported_parameter"
    assert refused.json()["error"]["param"] == param
    assert plain.status_code == 200


async def test_a_resumed_tool_call_or_json_answer_continues_where_it_stopped() -> None:
    """A re-run after a crash yields the rest of the same output, and no second call."""
    model = MockBackend(tokens_per_second=1e6)
    tool = {"name": "get_weather", "parameters": PARAMS["get_weather"]}
    for extra in (
        {"tools": (tool,), "tool_choice": "required"},
        {"response_format": {"type": "json_schema", "schema": PERSON}},
    ):
        base: Any = {"prompt": "p", "max_tokens": 400, "seed": 11, "prompt_tokens": 1, **extra}
        full = [t async for t in model.generate(GenerationRequest(**base))]
        texts = [t for t in full if isinstance(t, str)]
        assert len(full) - len(texts) == (1 if "tools" in extra else 0)
        for cut in (1, len(texts) // 2, len(texts)):
            resumed = GenerationRequest(**base, generated=tuple(texts[:cut]))
            rest = [t async for t in model.generate(resumed)]
            assert not any(isinstance(t, ToolCallStart) for t in rest)
            assert [*texts[:cut], *rest] == texts


async def test_a_worker_refuses_what_it_cannot_honour_when_the_api_could_not_tell(
    start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    """Accepted with no worker alive (LLMQ_ACCEPT_MODELS), run by a text-only backend:
    the request fails with unsupported_parameter instead of ignoring the tools."""
    api = await start_api(accept_models="mock")
    async with api.client() as client:
        pending = asyncio.create_task(
            client.post(
                "/v1/chat/completions",
                json={"model": "mock", "messages": CHAT, "tools": [WEATHER], "seed": 1},
            )
        )
        await wait_until(
            lambda: redis.exists(keys.queue("mock")), timeout=10, what="the request to queue"
        )
        await start_worker(backend=TextOnly())
        r = await pending
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "unsupported_parameter"
    assert "tools" in r.json()["error"]["message"]


def test_token_events_carry_logprobs_only_when_asked() -> None:
    """The usual event is written as before, readable by readers without the field."""
    plain = encode_event(TokensEvent(index=3, tokens=[" a"]))
    assert json.loads(plain["data"]) == {"type": "tokens", "index": 3, "tokens": [" a"]}
    lp = TokenLogprob(logprob=-0.5, top=[(" a", -0.5), (" b", -1.0)])
    rich = encode_event(TokensEvent(index=3, tokens=[" a"], logprobs=[lp]))
    assert decode_event(rich) == TokensEvent(index=3, tokens=[" a"], logprobs=[lp])


def test_generated_documents_stay_bounded_and_valid() -> None:
    """Nesting cannot blow the mock's output up; what no document can satisfy is refused."""
    deep: dict[str, Any] = {"type": "integer"}
    for _ in range(15):
        deep = {"type": "array", "items": deep}
    huge = {"type": "array", "minItems": 1000, "items": {"type": "array", "minItems": 1000}}
    empty = {"type": "array", "maxItems": 0, "items": {"type": "string"}}
    assert unsupported(deep) is None and unsupported(empty) is None
    assert unsupported(huge) is not None and "smallest document" in (unsupported(huge) or "")
    assert "no integer" in (unsupported({"type": "integer", "minimum": 0.2, "maximum": 0.8}) or "")
    assert "minItems" in (unsupported({"type": "array", "minItems": "3"}) or "")
    for seed in range(5):
        for schema in (deep, empty, PERSON):
            text = object_text(schema, random.Random(seed))
            assert len(text) < 3 * BUDGET
            jsonschema.validate(json.loads(text), schema)


async def test_completions_honour_response_format_too(fast: RunningApi) -> None:
    """As vLLM does: a JSON schema on /v1/completions is honoured, not ignored."""
    client = sdk(fast)
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}
    reply = await client.completions.create(
        model="mock", prompt="x", max_tokens=500, extra_body={"response_format": fmt}
    )
    await client.close()
    jsonschema.validate(json.loads(reply.choices[0].text), PERSON)
