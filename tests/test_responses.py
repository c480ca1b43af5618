"""The Responses API through the openai SDK, unmodified: ``responses.create`` (text,
items, function tools and tool outputs, ``text.format``, ``max_output_tokens``),
``responses.stream`` (the typed ``response.*`` events), ``responses.parse`` on
Pydantic models, ``previous_response_id``, ``GET``/``DELETE /v1/responses/{id}``,
``store: false``, and OpenAI's error shape for what it refuses.

(``parse`` on models with Optional, nested or Enum fields depends on the JSON
Schema subset's coverage of ``$ref``/``anyOf``; the models here stay inside what
the subset accepts today.)
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from pydantic import BaseModel
from redis.asyncio import Redis

from api.responses.responses_format import ResponseFormat
from api.responses.responses_input import ResponsesRequest
from llmq.policy.store import set_values
from llmq.protocol import keys
from tests.support.native import wait_ready
from tests.support.servers import RunningApi, StartApi, StartWorker
from tests.support.waiting import wait_until

WEATHER_TOOL: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
    "strict": True,
}


#: The mock generates until the limit (an extension field, as vLLM's): exact counts.
UNTIL_LIMIT = {"ignore_eos": True}


class Person(BaseModel):
    name: str
    age: int
    tags: list[str]


@pytest.fixture
async def client(fast: RunningApi) -> AsyncIterator[openai.AsyncOpenAI]:
    """The SDK against a stack whose mock is fast; closed at the end of the test."""
    async with fast.sdk() as sdk:
        yield sdk


async def test_create_text_with_instructions(client: openai.AsyncOpenAI) -> None:
    response = await client.responses.create(
        model="mock",
        instructions="Be brief.",
        input="Say hello",
        max_output_tokens=6,
        extra_body=UNTIL_LIMIT,
    )
    assert response.id.startswith("resp_")
    assert response.object == "response"
    assert response.status == "incomplete"  # the mock never stops before the limit
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert len(response.output_text.split()) == 6
    (message,) = response.output
    assert message.type == "message" and message.role == "assistant"
    assert response.usage is not None
    assert response.usage.output_tokens == 6
    # "system: Be brief.\nuser: Say hello\nassistant:" in the mock's whitespace tokens.
    assert response.usage.input_tokens == 7
    assert response.instructions == "Be brief."


async def test_create_with_message_items(client: openai.AsyncOpenAI) -> None:
    items: list[Any] = [
        {"role": "developer", "content": "Answer in French."},
        {"role": "user", "content": [{"type": "input_text", "text": "one two three"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "un deux"}]},
        {"type": "message", "role": "user", "content": "and four?"},
    ]
    response = await client.responses.create(
        model="mock",
        input=items,
        max_output_tokens=3,
        extra_body={"seed": 7, **UNTIL_LIMIT},
    )
    assert len(response.output_text.split()) == 3
    assert response.usage is not None
    expected = "developer: Answer in French.\nuser: one two three\nassistant: un deux\n"
    assert response.usage.input_tokens == len((expected + "user: and four?\nassistant:").split())


async def streamed(client: openai.AsyncOpenAI, **fields: Any) -> list[Any]:
    """Every event of ``responses.stream(**fields)``, in order."""
    async with client.responses.stream(**fields) as stream:
        return [event async for event in stream]


async def test_stream_typed_events(client: openai.AsyncOpenAI) -> None:
    events = await streamed(
        client, model="mock", input="stream please", max_output_tokens=5, extra_body=UNTIL_LIMIT
    )
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",  # the token limit, as OpenAI ends such a stream
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    final = events[-1].response
    assert len(deltas) >= 1 and "".join(deltas) == final.output_text
    assert len(final.output_text.split()) == 5
    assert final.incomplete_details.reason == "max_output_tokens"
    assert final.usage is not None and final.usage.output_tokens == 5


async def test_function_tool_call_and_output(client: openai.AsyncOpenAI) -> None:
    first = await client.responses.create(
        model="mock",
        input="weather in Paris?",
        tools=[WEATHER_TOOL],
        tool_choice="required",
        max_output_tokens=200,
    )
    assert first.status == "completed"
    (call,) = first.output
    assert call.type == "function_call"
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    arguments = json.loads(call.arguments)
    assert set(arguments) == {"city", "unit"}
    # The tool's output goes back as an item, with the call, as an agent loop sends it.
    second = await client.responses.create(
        model="mock",
        input=[
            {"role": "user", "content": "weather in Paris?"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21"},
        ],
        tools=[WEATHER_TOOL],
        tool_choice="none",
        max_output_tokens=4,
        extra_body=UNTIL_LIMIT,
    )
    assert second.output[0].type == "message"
    assert len(second.output_text.split()) == 4
    assert second.usage is not None
    history = f"user: weather in Paris?\nassistant:  get_weather({call.arguments})\n"
    prompt = history + "tool: sunny, 21\nassistant:"
    assert second.usage.input_tokens == len(prompt.split())


async def test_streamed_function_call(client: openai.AsyncOpenAI) -> None:
    kinds: list[str] = []
    async with client.responses.stream(
        model="mock",
        input="weather?",
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=200,
    ) as stream:
        async for event in stream:
            kinds.append(event.type)
        final = await stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds
    assert kinds[-3:] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    (call,) = final.output
    assert call.type == "function_call"
    assert set(json.loads(call.arguments)) == {"city", "unit"}


async def test_parse_pydantic_model(client: openai.AsyncOpenAI) -> None:
    parsed = await client.responses.parse(
        model="mock", input="who?", text_format=Person, max_output_tokens=300
    )
    assert isinstance(parsed.output_parsed, Person)
    assert parsed.text is not None and parsed.text.format is not None
    assert parsed.text.format.type == "json_schema"


async def test_stream_with_text_format(client: openai.AsyncOpenAI) -> None:
    async with client.responses.stream(
        model="mock", input="who?", text_format=Person, max_output_tokens=300
    ) as stream:
        final = await stream.get_final_response()
    assert isinstance(final.output_parsed, Person)


async def test_json_object_format(client: openai.AsyncOpenAI) -> None:
    response = await client.responses.create(
        model="mock", input="JSON please", text={"format": {"type": "json_object"}}
    )
    assert isinstance(json.loads(response.output_text), dict)


async def test_previous_response_id_continues_and_get_returns_it(
    client: openai.AsyncOpenAI,
) -> None:
    first = await client.responses.create(
        model="mock", instructions="Be brief.", input="one two", max_output_tokens=3
    )
    fetched = await client.responses.retrieve(first.id)
    assert fetched.id == first.id and fetched.output_text == first.output_text
    second = await client.responses.create(
        model="mock", input="three", previous_response_id=first.id, max_output_tokens=2
    )
    assert second.previous_response_id == first.id
    assert second.usage is not None
    # The instructions do not carry over; the first turn's input and output do.
    prompt = f"user: one two\nassistant: {first.output_text}\nuser: three\nassistant:"
    assert second.usage.input_tokens == len(prompt.split())
    await client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(first.id)


async def test_stored_under_the_request_ttl(client: openai.AsyncOpenAI, redis: Redis) -> None:
    """Kept as long as the pool policy's ``request_ttl_seconds`` as it is when stored: a
    change reaches the running API without a restart."""

    async def stored_ttl() -> int:
        response = await client.responses.create(model="mock", input="keep", max_output_tokens=2)
        return int(await redis.ttl(keys.stored_response(response.id.removeprefix("resp_"))))

    assert 3000 < await stored_ttl() <= 3600
    await set_values(redis, {"request_ttl_seconds": 60}, None, "op")

    async def followed() -> bool:
        return 0 < await stored_ttl() <= 60

    await wait_until(followed, timeout=2, what="the stored response's new lifetime")


async def test_store_false_keeps_nothing(client: openai.AsyncOpenAI) -> None:
    response = await client.responses.create(
        model="mock", input="forget", store=False, max_output_tokens=2
    )
    with pytest.raises(openai.NotFoundError) as missing:
        await client.responses.retrieve(response.id)
    assert missing.value.code == "response_not_found"
    with pytest.raises(openai.BadRequestError) as refused:
        await client.responses.create(model="mock", input="more", previous_response_id=response.id)
    assert refused.value.code == "previous_response_not_found"
    assert refused.value.param == "previous_response_id"


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type", "unsupported_parameter"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0]",
            "unsupported_parameter",
        ),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0]", "unsupported_parameter"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input[0]", None),
        ({"max_output_tokens": 0}, "max_output_tokens", None),
        ({"background": True}, "background", "unsupported_parameter"),
        ({"tool_choice": "required"}, "tool_choice", "invalid_value"),
        (
            {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}}},
            "text.format.schema",
            "unsupported_parameter",
        ),
        ({"input": " "}, "input", "invalid_value"),
    ],
)
async def test_bad_input_gets_openai_errors(
    fast: RunningApi, fields: dict[str, Any], param: str, code: str | None
) -> None:
    body = {"model": "mock", "input": "hi", **fields}
    async with fast.client() as http:
        reply = await http.post("/v1/responses", json=body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    if code is not None:
        assert error["code"] == code


async def test_generation_timeout_fails_the_response(fast: RunningApi) -> None:
    """A stream ends with ``response.failed`` (its error says why); a plain call gets 504."""
    body = {"generation_timeout": 0.2, **UNTIL_LIMIT}
    async with fast.sdk() as sdk:
        events = await streamed(
            sdk, model="mock", input="long", max_output_tokens=4000, extra_body=body
        )
        failed = events[-1]
        assert failed.type == "response.failed"
        assert failed.response.status == "failed"
        assert failed.response.error.code == "generation_timeout"
        assert failed.response.output_text  # what came before the timeout
        with pytest.raises(openai.APIStatusError) as timed_out:
            await sdk.responses.create(
                model="mock", input="long", max_output_tokens=4000, extra_body=body
            )
    assert timed_out.value.status_code == 504
    assert timed_out.value.code == "generation_timeout"


async def test_a_response_is_visible_only_to_its_key(
    start_api: StartApi, start_worker: StartWorker
) -> None:
    await start_worker(model_tokens_per_second=2000.0)
    api = await start_api(api_keys="key-one, key-two")
    async with api.client() as http:
        await wait_ready(http)
    async with api.sdk("key-one") as one, api.sdk("key-two") as two:
        made = await one.responses.create(model="mock", input="mine", max_output_tokens=2)
        assert (await one.responses.retrieve(made.id)).id == made.id
        with pytest.raises(openai.NotFoundError):
            await two.responses.retrieve(made.id)
        with pytest.raises(openai.BadRequestError):
            await two.responses.create(
                model="mock", input="next", previous_response_id=made.id, max_output_tokens=2
            )
        with pytest.raises(openai.NotFoundError):
            await two.responses.delete(made.id)


async def test_a_client_that_leaves_cancels_its_response(stack: RunningApi, redis: Redis) -> None:
    """As on the chat path: a stream closed early stops the generation."""
    body = {"model": "mock", "input": "long", "max_output_tokens": 500, "stream": True}
    async with stack.client() as http, http.stream("POST", "/v1/responses", json=body) as reply:
        async for line in reply.aiter_lines():
            if "response.output_text.delta" in line:
                break
    (key,) = await redis.keys(keys.REQUESTS_GLOB)

    async def cancelled() -> bool:
        status: str | None = await redis.hget(key, "status")  # type: ignore[misc]
        return status == "cancelled"

    await wait_until(cancelled, timeout=10, what="the response's request to be cancelled")
    assert int(await redis.hget(key, "completion_tokens")) < 500  # type: ignore[misc]


def test_text_delta_frame_is_the_event_byte_for_byte() -> None:
    body = ResponsesRequest.model_validate({"model": "mock", "input": "x"})
    fast_path, plain = ResponseFormat(body, "r1", 0, "mock"), ResponseFormat(body, "r1", 0, "mock")
    where = {"item_id": "msg_r1", "output_index": 0, "content_index": 0}
    for text in [" word", 'quote " and \\ back', "ünïcode ☃", "\n"]:
        expected = plain.event(
            "response.output_text.delta", where | {"delta": text, "logprobs": []}
        )
        assert fast_path.text_delta(text) == expected
