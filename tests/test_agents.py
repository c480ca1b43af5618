"""openai-agents, unmodified, against a real stack: its default model is the Responses
API (``OpenAIResponsesModel``), for plain answers, streamed runs and function tools.

The provider is given the stack's client through the run's config (nothing global
is changed); tracing is off, as it would export to OpenAI.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import openai
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIProvider,
    RunConfig,
    Runner,
    function_tool,
)
from agents.models.openai_responses import OpenAIResponsesModel

from tests.support.native import wait_ready
from tests.support.servers import RunningApi, StartApi, StartWorker


@pytest.fixture
async def stopping(start_api: StartApi, start_worker: StartWorker) -> RunningApi:
    """A fast mock that stops by itself (an agent treats a cut answer as a failure)."""
    await start_worker(model_tokens_per_second=2000.0, model_stop_probability=0.2)
    api = await start_api()
    async with api.client() as http:
        await wait_ready(http)
    return api


@pytest.fixture
async def config(stopping: RunningApi) -> AsyncIterator[RunConfig]:
    async with stopping.sdk() as client:
        provider = OpenAIProvider(openai_client=client)
        yield RunConfig(model_provider=provider, tracing_disabled=True)


def test_the_default_model_is_the_responses_api() -> None:
    provider = OpenAIProvider(openai_client=openai.AsyncOpenAI(api_key="unused"))
    assert isinstance(provider.get_model("mock"), OpenAIResponsesModel)


async def test_runner_run_answers(config: RunConfig) -> None:
    agent = Agent(
        name="brief",
        instructions="Be brief.",
        model="mock",
        model_settings=ModelSettings(max_tokens=200),
    )
    result = await Runner.run(agent, "Say hello", run_config=config)
    assert isinstance(result.final_output, str) and result.final_output
    (response,) = result.raw_responses
    assert response.usage.output_tokens == len(result.final_output.split())


async def test_runner_calls_a_function_tool(config: RunConfig) -> None:
    called: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        called.append(city)
        return f"sunny in {city}"

    agent = Agent(
        name="weather",
        instructions="Use the tool.",
        model="mock",
        tools=[get_weather],
        model_settings=ModelSettings(tool_choice="required", max_tokens=200),
        # The tool's result is the answer: one model turn, whatever the mock says next.
        tool_use_behavior="stop_on_first_tool",
    )
    result = await Runner.run(agent, "weather in Paris?", run_config=config)
    assert len(called) == 1
    assert result.final_output == f"sunny in {called[0]}"


async def test_tool_output_goes_back_to_the_model(config: RunConfig) -> None:
    """A second turn carries the call and its output as items; the model answers text."""
    called: list[str] = []

    @function_tool
    def lookup(term: str) -> str:
        """Look a term up."""
        called.append(term)
        return "found"

    agent = Agent(
        name="lookup",
        model="mock",
        tools=[lookup],
        model_settings=ModelSettings(tool_choice="required", max_tokens=200),
        tool_use_behavior="stop_on_first_tool",
    )
    answered = Agent(
        name="answer",
        model="mock",
        tools=[lookup],
        model_settings=ModelSettings(tool_choice="none", max_tokens=200),
    )
    first = await Runner.run(agent, "look up llmq", run_config=config)
    assert len(called) == 1
    second = await Runner.run(answered, first.to_input_list(), run_config=config)
    assert isinstance(second.final_output, str) and second.final_output
    (response,) = second.raw_responses
    assert response.output[0].type == "message"


async def test_run_streamed(config: RunConfig) -> None:
    agent = Agent(
        name="streamer",
        model="mock",
        model_settings=ModelSettings(max_tokens=200),
    )
    run = Runner.run_streamed(agent, "stream", run_config=config)
    deltas = []
    async for event in run.stream_events():
        if event.type == "raw_response_event" and event.data.type == "response.output_text.delta":
            deltas.append(event.data.delta)
    assert isinstance(run.final_output, str)
    assert run.final_output and "".join(deltas) == run.final_output
