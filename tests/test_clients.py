"""langchain-openai, unmodified, against a real stack: the paths that broke before
(prompt lists, ``n``, tools, structured output) now do what they do against OpenAI.

(litellm is not a test dependency: it pulls boto3, tokenizers, huggingface_hub and
fetches its model price map over the network at import.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Literal

import openai
import pytest
from langchain_core.messages import AIMessage
from langchain_openai import ChatOpenAI, OpenAI
from pydantic import BaseModel, Field

from tests.support.servers import RunningApi


@pytest.fixture
async def http() -> AsyncIterator[openai.DefaultAsyncHttpxClient]:
    """The clients' HTTP client, closed at the end of the test (langchain's own
    cached one would outlive the test's event loop)."""
    client = openai.DefaultAsyncHttpxClient()
    yield client
    await client.aclose()


def chat(api: RunningApi, http: openai.DefaultAsyncHttpxClient, **kwargs: Any) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=api.url + "/v1",
        api_key="unused",
        model="mock",
        max_retries=0,
        http_async_client=http,
        **kwargs,
    )


def llm(api: RunningApi, http: openai.DefaultAsyncHttpxClient, **kwargs: Any) -> OpenAI:
    return OpenAI(
        base_url=api.url + "/v1",
        api_key="unused",
        model="mock",
        max_retries=0,
        http_async_client=http,
        **kwargs,
    )


class Weather(BaseModel):
    """Weather in a city."""

    city: str = Field(description="the city")
    unit: str = Field(description="celsius or fahrenheit")


class Person(BaseModel):
    name: str
    age: int
    tags: list[str]


async def test_llm_generate_sends_a_prompt_list_and_n(
    fast: RunningApi, http: openai.DefaultAsyncHttpxClient
) -> None:
    """``OpenAI.generate`` batches prompts into one ``prompt: [...]`` request."""
    result = await llm(fast, http, max_tokens=4, n=2).agenerate(["one", "two", "three"])
    assert [len(g) for g in result.generations] == [2, 2, 2]
    assert all(len(g.text.split()) == 4 for gs in result.generations for g in gs)
    assert result.llm_output is not None
    assert result.llm_output["token_usage"]["completion_tokens"] == 3 * 2 * 4
    batched = await llm(fast, http, max_tokens=3).abatch(["a", "b"])
    assert len(batched) == 2


async def test_bind_tools_gets_tool_calls(
    fast: RunningApi, http: openai.DefaultAsyncHttpxClient
) -> None:
    model = chat(fast, http, max_tokens=200).bind_tools([Weather], tool_choice="Weather")
    reply = await model.ainvoke("weather in Paris?")
    assert isinstance(reply, AIMessage)
    (call,) = reply.tool_calls
    assert call["name"] == "Weather"
    Weather.model_validate(call["args"])
    streamed: Any = None
    async for piece in (
        chat(fast, http, max_tokens=200)
        .bind_tools([Weather], tool_choice="any")
        .astream("weather?")
    ):
        streamed = piece if streamed is None else streamed + piece
    assert isinstance(streamed, AIMessage) and streamed.tool_calls
    Weather.model_validate(streamed.tool_calls[0]["args"])


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
async def test_with_structured_output(
    fast: RunningApi,
    http: openai.DefaultAsyncHttpxClient,
    method: Literal["function_calling", "json_mode", "json_schema"],
) -> None:
    if method == "json_mode":
        runnable: Any = chat(fast, http, max_tokens=200).with_structured_output(
            None, method="json_mode"
        )
        answer = await runnable.ainvoke("answer in JSON")
        assert isinstance(answer, dict)
        return
    structured = chat(fast, http, max_tokens=300).with_structured_output(Person, method=method)
    person = await structured.ainvoke("who?")
    assert isinstance(person, Person)
