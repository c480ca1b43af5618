"""Routing's block names for a chat request follow its engine's rendering.

A worker sends chat requests to llama.cpp's chat API, which applies the model's own
template; under a routed policy the API names the blocks of that rendering (asked of
the engine's ``/apply-template``, :mod:`api.chat_render`), so that the names a claim
records for the worker are those of the prompt its engine caches. With the engine
unreachable, the names are the plain rendering's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from redis.asyncio import Redis

from llmq.model.blocks import block_hashes
from llmq.model.tokenizer import CHARS
from llmq.protocol import codec, keys
from rigs.llama import TinyModel, write_tiny_gguf
from rigs.vllm import VllmServer, vllm_server, write_tiny_hf_model
from tests.support.llama import MODEL, LlamaServer
from tests.support.native import ready_workers, workers
from tests.support.recording_proxy import RecordingProxy
from tests.support.servers import SpawnWorkers, StartApi
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.timeout(120), pytest.mark.engine]

#: A template unlike llmq's plain ``role: content`` rendering from its first token.
TEMPLATE = (
    "{% for m in messages %}{{ '<<' + m['role'] + '>> ' + m['content'] + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<<assistant>> ' }}{% endif %}"
)
#: Long enough for several 16-token blocks.
MESSAGES = [
    {"role": "system", "content": " ".join(f"rule{i}" for i in range(40))},
    {"role": "user", "content": " ".join(f"word{i}" for i in range(40))},
]
PLAIN = "\n".join([*(f"{m['role']}: {m['content']}" for m in MESSAGES), "assistant:"])


def _names(text: str) -> list[str]:
    """Block names of ``text`` cut as the pool's routing cuts it: by ``chars``, the
    tokenizer an upstream's worker declares (derived, docs/policy.md)."""
    return block_hashes(CHARS.tokens(text), limit=256)


@pytest.fixture(scope="module")
def templated_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "templated.gguf"
    return write_tiny_gguf(path, TinyModel(chat_template=TEMPLATE))


@pytest.fixture
async def server(templated_gguf: Path) -> AsyncIterator[LlamaServer]:
    running = await LlamaServer(templated_gguf, slots=2).start()
    yield running
    await asyncio.to_thread(running.stop)


async def _rendered(server: LlamaServer) -> str:
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        answer = await client.post("/apply-template", json={"messages": MESSAGES})
        answer.raise_for_status()
        prompt: str = answer.json()["prompt"]
    return prompt


async def test_a_routed_chat_request_names_the_blocks_of_the_engines_rendering(
    server: LlamaServer, spawn_workers: SpawnWorkers, start_api: StartApi, redis: Redis
) -> None:
    """The worker registers its engine's render endpoint; the claim records, for the
    worker, the blocks of the prompt as the engine renders it, not the plain one."""
    await spawn_workers(1, **server.worker_settings(routing="prefix"))
    want = _names(await _rendered(server))
    await _names_recorded(start_api, redis, f"{server.url}/apply-template", want)


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    directory = tmp_path_factory.mktemp("vllm")
    model = write_tiny_hf_model(directory / "model")
    with vllm_server(model, directory / "vllm.log", slots=2) as server:
        yield server


@pytest.mark.timeout(300)  # the server starts
async def test_vllms_rendering_is_named_by_its_token_ids(
    vllm: VllmServer, spawn_workers: SpawnWorkers, start_api: StartApi, redis: Redis
) -> None:
    """vLLM renders messages into token ids (``/tokenize`` with ``messages``): the
    blocks recorded for the worker are named by those ids, 16 to a block, as its
    prefix cache cuts them."""
    await spawn_workers(1, model=MODEL, backend="openai", upstream_url=vllm.url, routing="prefix")
    body = {"model": MODEL, "messages": MESSAGES, "add_generation_prompt": True}
    async with httpx.AsyncClient(base_url=vllm.url, timeout=30) as client:
        answer = await client.post("/tokenize", json=body)
        answer.raise_for_status()
        ids = answer.json()["tokens"]
    want = block_hashes([str(i) for i in ids], limit=256)
    await _names_recorded(start_api, redis, f"{vllm.url}/tokenize", want)


async def _names_recorded(start_api: StartApi, redis: Redis, url: str, want: list[str]) -> None:
    """A routed chat request through the one worker: its claim records ``want`` (the
    blocks of the engine's rendering at ``url``), none of the plain rendering's."""
    api = await start_api(routing="prefix")
    await ready_workers(api, 1)
    plain = _names(PLAIN)
    assert len(want) >= 2 and not set(want) & set(plain)
    async with api.client() as client:
        (worker,) = await workers(client)
        assert worker["upstream"]["render"]["url"] == url
        answer = await client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": MESSAGES, "max_tokens": 2},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
    held_key = keys.cache_prefix(MODEL) + worker["id"]

    async def held() -> set[str]:
        members = await cast("Any", redis.smembers(held_key))
        return {m.decode() if isinstance(m, bytes) else m for m in members}

    async def recorded() -> bool:
        return set(want) <= await held()

    await wait_until(recorded, timeout=20, what="the worker's cache set names the rendering")
    assert not set(plain) & await held()


async def test_with_the_engine_unreachable_the_plain_rendering_is_named(
    server: LlamaServer, spawn_workers: SpawnWorkers, start_api: StartApi, redis: Redis
) -> None:
    """A render endpoint that does not answer costs nothing but the plain names: the
    request is admitted, its route hint names the plain rendering's blocks."""
    await spawn_workers(1, **server.worker_settings(routing="prefix"))
    api = await start_api(routing="prefix")
    await ready_workers(api, 1)
    server.kill()
    async with api.client() as client:

        async def unready() -> bool:  # claims nothing now: the request stays queued
            return not any(w["ready"] for w in await workers(client))

        await wait_until(unready, timeout=20, what="the worker to find its engine gone")
        sent = asyncio.create_task(
            client.post(
                "/v1/chat/completions",
                json={"model": MODEL, "messages": MESSAGES, "max_tokens": 2},
                timeout=60,
            )
        )
        try:

            async def queued() -> bool:
                return bool(await cast("Any", redis.hlen(keys.routes(MODEL))))

            await wait_until(queued, timeout=20, what="the request queued with its route hint")
            (raw,) = (await cast("Any", redis.hgetall(keys.routes(MODEL)))).values()
        finally:
            sent.cancel()
            with contextlib.suppress(BaseException):
                await sent
    assert list(codec.RouteHint.decode(raw).blocks) == _names(PLAIN)


@pytest.mark.parametrize(("routing", "calls"), [("fifo", 0), ("prefix", 1)])
async def test_only_a_routed_policy_asks_and_once_per_conversation(
    server: LlamaServer,
    spawn_workers: SpawnWorkers,
    start_api: StartApi,
    routing: str,
    calls: int,
) -> None:
    """Under ``fifo`` no rendering is asked for; under a routed policy one per distinct
    conversation (the same messages again are named from the cache)."""
    proxy = RecordingProxy(server.port)
    url = await proxy.start()
    try:
        await spawn_workers(1, **server.worker_settings(upstream_url=url, routing=routing))
        api = await start_api(routing=routing)
        await ready_workers(api, 1)
        async with api.client() as client:
            for _ in range(2):
                answer = await client.post(
                    "/v1/chat/completions",
                    json={"model": MODEL, "messages": MESSAGES, "max_tokens": 2},
                    timeout=60,
                )
                assert answer.status_code == 200, answer.text
        asked = [r for c in proxy.connections for r in c.requests if r.endswith("/apply-template")]
        assert len(asked) == calls
    finally:
        await proxy.close()
