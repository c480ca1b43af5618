"""Structured output and the mock's defaults with the clients that broke on them:
openai-py's ``.parse()`` and ``.stream()`` helpers on Pydantic models, LangChain's
``with_structured_output`` (json_schema, function_calling, json_mode), instructor
(tools and JSON mode), an agent's tool loop. Every document is checked with
``jsonschema`` (formats included), per seed, streamed and not."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from typing import Any

import instructor
import openai
import pytest
from langchain_core.output_parsers import PydanticOutputParser
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

from llmq.model.json_subset import unsupported
from llmq.settings import WorkerSettings
from tests.support.native import wait_ready
from tests.support.schemas import (
    PYDANTIC,
    REFUSED,
    SCHEMAS,
    Address,
    Formats,
    Node,
    Person,
    validate,
)
from tests.support.servers import RunningApi, StartApi, StartWorker
from worker.structured import object_text, schema_in_prompt

CHAT: list[Any] = [{"role": "user", "content": "describe someone"}]
SEEDS = range(4)


@pytest.fixture
async def modelled(start_api: StartApi, start_worker: StartWorker) -> RunningApi:
    """A stack whose mock stops by itself at the default mean length, as served."""
    default = WorkerSettings.model_fields["model_mean_tokens"].default
    await start_worker(model_tokens_per_second=2000.0, model_mean_tokens=default)
    api = await start_api()
    async with api.client() as client:
        await wait_ready(client)
    return api


@pytest.fixture
async def http() -> AsyncIterator[openai.DefaultAsyncHttpxClient]:
    """The clients' HTTP client, closed within the test's event loop."""
    client = openai.DefaultAsyncHttpxClient()
    yield client
    await client.aclose()


def sdk(api: RunningApi, http: openai.DefaultAsyncHttpxClient) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=api.url + "/v1", api_key="unused", max_retries=0, http_client=http
    )


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_generated_documents_validate(name: str) -> None:
    """Every seed, and the short form drawn when a document would not fit max_tokens."""
    schema = SCHEMAS[name]
    assert unsupported(schema) is None
    texts = set()
    for seed in range(60):
        text = object_text(schema, random.Random(seed))
        validate(json.loads(text), schema)
        texts.add(text)
        validate(json.loads(object_text(schema, random.Random(seed), limit=5)), schema)
    assert object_text(schema, random.Random(7)) == object_text(schema, random.Random(7))
    assert len(texts) > 10


async def test_what_is_still_refused_is_named(fast: RunningApi) -> None:
    async with fast.client() as client:
        for feature, schema in REFUSED.items():
            fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
            r = await client.post(
                "/v1/chat/completions",
                json={"model": "mock", "messages": CHAT, "response_format": fmt},
            )
            assert r.status_code == 400, feature
            error = r.json()["error"]
            assert error["code"] == "unsupported_parameter", feature
            assert error["message"].startswith("response_format.json_schema: schema"), feature


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.slow
async def test_client_schemas_validate_through_the_api(
    fast: RunningApi, http: openai.DefaultAsyncHttpxClient, stream: bool
) -> None:
    client = sdk(fast, http)
    for name, schema in SCHEMAS.items():
        fmt: Any = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
        texts = []
        for seed in (1, 1, 2):
            kwargs: Any = {"messages": CHAT, "response_format": fmt, "seed": seed}
            if stream:
                text = ""
                chunks = await client.chat.completions.create(
                    model="mock", stream=True, max_tokens=3000, **kwargs
                )
                async for chunk in chunks:
                    text += "".join(c.delta.content or "" for c in chunk.choices)
            else:
                reply = await client.chat.completions.create(
                    model="mock", max_tokens=3000, **kwargs
                )
                text = reply.choices[0].message.content or ""
            validate(json.loads(text), schema)
            texts.append(text)
        assert texts[0] == texts[1], name


@pytest.mark.parametrize("stream", [False, True])
async def test_openai_parse_fills_pydantic_models(
    fast: RunningApi, http: openai.DefaultAsyncHttpxClient, stream: bool
) -> None:
    """``.parse()`` and ``.stream()`` with Optional, nested, Enum, list-of-model,
    Literal and discriminated-union fields, a recursive model, formats and tuples;
    no max_tokens, as the helpers are used."""
    client = sdk(fast, http)
    for model in (Person, Node, Formats):
        for seed in SEEDS:
            if stream:
                async with client.chat.completions.stream(
                    model="mock", messages=CHAT, response_format=model, seed=seed
                ) as events:
                    reply = await events.get_final_completion()
            else:
                reply = await client.chat.completions.parse(
                    model="mock", messages=CHAT, response_format=model, seed=seed
                )
            parsed = reply.choices[0].message.parsed
            assert isinstance(parsed, model)
            validate(json.loads(reply.choices[0].message.content or ""), model.model_json_schema())


@pytest.mark.parametrize("stream", [False, True])
async def test_responses_parse_fills_pydantic_models(
    fast: RunningApi, http: openai.DefaultAsyncHttpxClient, stream: bool
) -> None:
    """The Responses API's ``.parse()`` and ``.stream()`` on the same models."""
    client = sdk(fast, http)
    for model in (Person, Node, Formats):
        for seed in SEEDS:
            if stream:
                async with client.responses.stream(
                    model="mock",
                    input="describe someone",
                    text_format=model,
                    extra_body={"seed": seed},
                ) as events:
                    reply = await events.get_final_response()
            else:
                reply = await client.responses.parse(
                    model="mock",
                    input="describe someone",
                    text_format=model,
                    extra_body={"seed": seed},
                )
            assert isinstance(reply.output_parsed, model)
            validate(json.loads(reply.output_text), model.model_json_schema())


async def test_the_stream_helper_with_a_default_request_ends_by_itself(
    modelled: RunningApi, http: openai.DefaultAsyncHttpxClient
) -> None:
    """With a strict tool the helper raises LengthFinishReasonError on ``length``: a
    text answer must stop by itself within the default max_tokens."""
    client = sdk(modelled, http)
    reasons = []
    for seed in range(8):
        async with client.chat.completions.stream(
            model="mock",
            messages=CHAT,
            tools=[openai.pydantic_function_tool(Address)],
            seed=seed,
        ) as events:
            reply = await events.get_final_completion()
        reasons.append(reply.choices[0].finish_reason)
    assert set(reasons) == {"stop", "tool_calls"}


async def test_an_agent_loop_ends_after_the_tool_result(
    modelled: RunningApi, http: openai.DefaultAsyncHttpxClient
) -> None:
    """``tool_choice: "auto"``: the answer to a tool's result is text, for every seed."""
    client = sdk(modelled, http)
    tools: Any = [openai.pydantic_function_tool(Address)]
    for seed in range(6):
        messages: list[Any] = list(CHAT)
        for _ in range(3):
            reply = await client.chat.completions.create(
                model="mock", messages=messages, tools=tools, seed=seed
            )
            message = reply.choices[0].message
            if not message.tool_calls:
                break
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call.id, "content": "Oslo"})
        assert reply.choices[0].finish_reason == "stop" and message.content, seed
        assert len(messages) <= 3  # at most one call, then the answer


async def test_json_mode_follows_a_schema_in_the_prompt(
    fast: RunningApi, http: openai.DefaultAsyncHttpxClient
) -> None:
    client = sdk(fast, http)
    schema = Person.model_json_schema()
    system = "Answer in JSON that matches this schema:\n" + json.dumps(schema, indent=2)
    for seed in SEEDS:
        reply = await client.chat.completions.create(
            model="mock",
            messages=[{"role": "system", "content": system}, *CHAT],
            response_format={"type": "json_object"},
            seed=seed,
            max_tokens=1000,
        )
        Person.model_validate_json(reply.choices[0].message.content or "")
    plain = await client.chat.completions.create(
        model="mock", messages=CHAT, response_format={"type": "json_object"}, max_tokens=100
    )
    assert isinstance(json.loads(plain.choices[0].message.content or ""), dict)


def test_the_last_schema_in_a_prompt_wins() -> None:
    """LangChain's format instructions show an example schema before the real one."""
    instructions = PydanticOutputParser(pydantic_object=Address).get_format_instructions()
    found = schema_in_prompt("user: " + instructions + "\nassistant:")
    assert found is not None and set(found["properties"]) == {"city", "zip"}
    assert schema_in_prompt('user: {"a": 1} and {not json') is None


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
async def test_langchain_with_structured_output(
    fast: RunningApi, http: openai.DefaultAsyncHttpxClient, method: Any
) -> None:
    for model in (Person, Address):
        llm = ChatOpenAI(
            base_url=fast.url + "/v1",
            api_key="unused",
            model="mock",
            max_retries=0,
            http_async_client=http,
        )
        structured = llm.with_structured_output(model, method=method)
        prompt = "Describe someone."
        if method == "json_mode":
            parser: PydanticOutputParser[Any] = PydanticOutputParser(pydantic_object=model)
            prompt += "\n" + parser.get_format_instructions()
        for seed in SEEDS:
            got = await structured.ainvoke(prompt, seed=seed)
            assert isinstance(got, model), (method, seed, got)


@pytest.mark.parametrize("mode", [instructor.Mode.TOOLS, instructor.Mode.JSON])
async def test_instructor_fills_models(
    fast: RunningApi, http: openai.DefaultAsyncHttpxClient, mode: instructor.Mode
) -> None:
    client = instructor.from_openai(sdk(fast, http), mode=mode)
    for model in PYDANTIC:
        for seed in SEEDS:
            got: BaseModel = await client.chat.completions.create(
                model="mock",
                messages=CHAT,
                response_model=model,
                max_retries=0,
                seed=seed,
            )
            assert isinstance(got, model)
