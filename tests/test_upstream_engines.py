"""A worker finds which engine serves its upstream, from what only that engine answers.

llama.cpp and vLLM are identified against the real servers (``test_upstream.py``,
``test_upstream_vllm.py``); SGLang, TGI and Ollama are not run here, so each is a
stand-in server that answers its identifying endpoint with the fields its source
returns (SGLang's ``/server_info`` is its server arguments, TGI's ``/info`` its
``Info`` struct, Ollama's ``/api/version`` its version). A server that answers none
of them is ``generic``, and the worker says so in its log.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from llmq.embedded import free_port
from tests.support.servers import start_uvicorn
from tests.support.waiting import wait_until
from worker.backends import connect
from worker.backends.engines import ENGINES
from worker.backends.openai import OpenAIUpstream

pytestmark = pytest.mark.timeout(30)

MODELS = {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "x"}]}

#: What each stand-in serves beside ``/v1/models``.
ANSWERS: dict[str, dict[str, Any]] = {
    "sglang": {
        "/server_info": {
            "model_path": "m",
            "tokenizer_path": "m",
            "max_running_requests": 48,
            "context_length": 8192,
            "max_total_num_tokens": 400_000,
            "version": "0.5.0",
        },
    },
    "tgi": {
        "/info": {
            "model_id": "m",
            "max_concurrent_requests": 128,
            "max_input_tokens": 4095,
            "max_total_tokens": 4096,
            "version": "3.0.0",
        },
        "/health": {},
    },
    "ollama": {"/api/version": {"version": "0.6.0"}},
    "generic": {},
}

#: What the worker takes from each: slots and context length.
FOUND = {"sglang": (48, 8192), "tgi": (None, 4096), "ollama": (None, None), "generic": (None, None)}

Serve = Callable[..., Awaitable[str]]


@pytest.fixture
async def stand_in() -> AsyncIterator[Serve]:
    servers = []

    async def serve(answers: dict[str, Any], posts: dict[str, Any] | None = None) -> str:
        app = FastAPI()
        for path, answer in {"/v1/models": MODELS, **answers}.items():
            app.add_api_route(path, answer if callable(answer) else lambda answer=answer: answer)
        for path, answer in (posts or {}).items():
            app.add_api_route(path, lambda answer=answer: answer, methods=["POST"])
        port = free_port()
        server, task = start_uvicorn(app, port)
        servers.append((server, task))
        await wait_until(lambda: server.started, timeout=10, what="the stand-in to start")
        return f"http://127.0.0.1:{port}"

    yield serve
    for server, task in servers:
        server.should_exit = True
        await task


@pytest.mark.parametrize("engine", list(ANSWERS))
async def test_the_engine_is_identified_and_says_what_it_has(
    stand_in: Serve, engine: str, caplog: pytest.LogCaptureFixture
) -> None:
    upstream = OpenAIUpstream(await stand_in(ANSWERS[engine]), None)
    with caplog.at_level(logging.INFO, logger="worker.backends"):
        assert await connect(upstream, asyncio.Event())
    await upstream.aclose()
    assert upstream.engine is ENGINES[engine] and upstream.identified
    assert (upstream.slots, upstream.context_length) == FOUND[engine]
    unknown = [r for r in caplog.records if "none of the engines llmq knows" in r.message]
    assert len(unknown) == (engine == "generic")


async def test_a_model_without_a_chat_template_gets_llmqs_rendering_and_a_warning(
    stand_in: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    """vLLM refuses chat messages (400 at ``/tokenize``) for a model without a chat
    template: chat requests then go to its completions API, and the log says so."""
    app_models = {"object": "list", "data": [{"id": "m", "owned_by": "vllm", "max_model_len": 64}]}
    refusal = JSONResponse({"error": {"message": "no chat template"}}, status_code=400)
    url = await stand_in(
        {"/v1/models": app_models, "/version": {"version": "0.32.0"}},
        posts={"/tokenize": refusal},
    )
    upstream = OpenAIUpstream(url, None, chat=None)
    with caplog.at_level(logging.INFO, logger="worker.backends"):
        assert await connect(upstream, asyncio.Event())
    await upstream.aclose()
    assert upstream.engine is ENGINES["vllm"] and upstream.chat is False
    assert any("has no chat template" in r.message for r in caplog.records)


async def test_an_engine_still_loading_is_asked_again_not_taken_for_generic(
    stand_in: Serve,
) -> None:
    """llama-server answers 503 while it loads its model: the worker retries until it
    answers, and finds llama.cpp, not a generic server."""
    asked: list[int] = []

    def props() -> JSONResponse:
        asked.append(1)
        if len(asked) == 1:
            return JSONResponse({"error": {"message": "Loading model"}}, status_code=503)
        return JSONResponse({"total_slots": 3, "default_generation_settings": {"n_ctx": 512}})

    upstream = OpenAIUpstream(await stand_in({"/props": props}), None)
    assert await connect(upstream, asyncio.Event())
    await upstream.aclose()
    assert upstream.engine is ENGINES["llamacpp"] and len(asked) >= 2
    assert (upstream.slots, upstream.context_length) == (3, 512)


async def test_a_named_engine_is_taken_as_set(stand_in: Serve) -> None:
    """The setting overrides: a server that answers as SGLang, named TGI, is TGI."""
    url = await stand_in({**ANSWERS["sglang"], **ANSWERS["tgi"]})
    upstream = OpenAIUpstream(url, ENGINES["tgi"], slots=3)
    await upstream.connect()
    await upstream.aclose()
    assert upstream.engine is ENGINES["tgi"] and not upstream.identified
    assert (upstream.slots, upstream.context_length) == (3, 4096)
