"""Workers in front of a real inference server: llama.cpp's ``llama-server`` on a tiny
random model (:mod:`rigs.llama`), end to end through llmq with the openai SDK.

The server is not ours: tokens, usage and finish reasons come from it, a cancel
must free its slot, a re-run must continue its sequence. Without the server
binary these tests fail, they do not skip (``scripts/llama-server.sh`` builds it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import httpx
import jsonschema
import openai
import pytest
from redis.asyncio import Redis

from llmq.protocol import keys
from llmq.schema import StartedEvent, TokensEvent, ToolCallEvent, decode_event
from loadgen import LoadConfig, run_load
from rigs.llama import TOOLS_CHAT_TEMPLATE, TinyModel, write_tiny_gguf
from tests.support.completions import chat_text, direct, sdk, streamed
from tests.support.llama import MODEL, LlamaServer
from tests.support.native import ready_workers, record, wait_status, workers
from tests.support.processes import children_of, live_workers, reap, start_run, wait_for
from tests.support.recording_proxy import Connection, RecordingProxy
from tests.support.servers import SpawnWorkers, StartApi
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.timeout(120), pytest.mark.engine]

StartLlama = Callable[..., Awaitable[LlamaServer]]


#: Bigger than the benchmark's model: a token takes a millisecond or more, so that a
#: test can act on a sequence mid-stream (a kill, a cancel) while the server generates.
SHAPE = TinyModel(n_embd=256, n_ff=1024, n_layer=6)


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", SHAPE)


@pytest.fixture
async def start_llama(tiny_gguf: Path) -> AsyncIterator[StartLlama]:
    servers: list[LlamaServer] = []

    async def start(**kwargs: Any) -> LlamaServer:
        server = LlamaServer(kwargs.pop("model", tiny_gguf), **kwargs)
        servers.append(server)
        return await server.start()

    yield start
    await asyncio.gather(*(asyncio.to_thread(s.stop) for s in servers))


async def test_tokens_through_llmq_equal_the_server_directly(
    start_llama: StartLlama, spawn_workers: SpawnWorkers, start_api: StartApi
) -> None:
    server = await start_llama(slots=2)
    await spawn_workers(1, **server.worker_settings())
    api = await start_api()
    await ready_workers(api, 1)
    direct, through = sdk(server.url), sdk(api.url)
    for prompt in ("hello world", "the quick brown fox jumps"):
        want = await streamed(direct, prompt, 80)
        got = await streamed(through, prompt, 80)
        assert got[0] == want[0] and len(got[0]) == 80
        assert got[1] == want[1] == "length"
        assert got[2].completion_tokens == 80
        assert got[2].prompt_tokens == want[2].prompt_tokens  # the server's count
    async with api.client() as client:
        (entry,) = (await client.get("/v1/workers")).json()["data"]
    # the worker's cap is the server's slots; the API counts with the declared tokenizer
    assert entry["concurrency"] == 2 and entry["tokenizer"] == "chars"
    assert entry["context_length"] == 2048 and entry["ready"] is True
    # configured with the backend and the URL only: the engine was found
    assert entry["upstream"]["engine"] == "llamacpp" and entry["upstream"]["identified"]
    assert entry["upstream"]["slots"] == 2 and entry["upstream"]["tokenize"] == "/tokenize"
    await direct.close()
    await through.close()


def _counts(usage: Any) -> tuple[int, int]:
    return usage.prompt_tokens, usage.completion_tokens


#: The model's own chat template, unlike the ChatML llama-server falls back to.
TEMPLATE = (
    "{% for m in messages %}{{ '[' + m['role'] + '] ' + m['content'] + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '[assistant] ' }}{% endif %}"
)

CHATS: list[list[Any]] = [
    [{"role": "user", "content": "hello there"}],
    [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "what is the time"},
        {"role": "assistant", "content": "late"},
        {"role": "user", "content": "how late"},
    ],
]


@pytest.fixture(scope="session")
def templated_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    shape = dataclasses.replace(SHAPE, chat_template=TEMPLATE)
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "templated.gguf", shape)


@pytest.mark.parametrize("templated", [True, False], ids=["own-template", "no-template"])
async def test_chat_through_llmq_equals_the_servers_own_chat_given_only_its_url(
    start_llama: StartLlama,
    spawn_workers: SpawnWorkers,
    start_api: StartApi,
    templated_gguf: Path,
    templated: bool,
) -> None:
    """Configured with the backend and the URL alone, a worker sends chat requests to the
    server's chat API: its answers and counts are the server's own (the model's template,
    or the server's ChatML for a model without one), and its cap and context are the
    server's."""
    server = await start_llama(slots=2, **({"model": templated_gguf} if templated else {}))
    await spawn_workers(1, model=MODEL, backend="openai", upstream_url=server.url)
    api = await start_api()
    await ready_workers(api, 1)
    async with sdk(server.url) as direct_client, sdk(api.url) as through:
        for messages in CHATS:
            want = await chat_text(direct_client, messages, 60)
            assert await chat_text(through, messages, 60) == want
            answers = [
                await c.chat.completions.create(
                    model=MODEL, messages=messages, max_tokens=60, temperature=0
                )
                for c in (direct_client, through)
            ]
            assert _counts(answers[1].usage) == _counts(answers[0].usage)
            assert answers[1].choices[0].message.content == want
    async with api.client() as client:
        (entry,) = (await client.get("/v1/workers")).json()["data"]
    assert (entry["concurrency"], entry["context_length"]) == (2, 2048)
    assert entry["upstream"]["chat"] is True


async def test_llmq_run_serves_each_upstream_through_a_worker_of_its_own(
    start_llama: StartLlama,
) -> None:
    """``llmq run --upstream URL --upstream URL``: one worker per server, each finding
    its engine, slots and context; the answers are the servers'."""
    servers = [await start_llama(slots=2), await start_llama(slots=1)]
    argv = ["--model", MODEL, "--upstream", servers[0].url, "--upstream", servers[1].url]
    url, proc = start_run(*argv)
    kids: list[int] = []
    try:
        await asyncio.to_thread(
            wait_for, lambda: live_workers(url) == 2, 60, "a worker per upstream", proc
        )
        kids = children_of(proc.pid)
        async with httpx.AsyncClient(base_url=url) as client:
            listed = (await client.get("/v1/workers")).json()["data"]
        found = sorted((w["upstream"]["engine"], w["concurrency"]) for w in listed)
        assert found == [("llamacpp", 1), ("llamacpp", 2)]
        async with sdk(url) as through:
            text, finish, _ = await streamed(through, "two servers", 40)
        assert text == await direct(servers[0].url, "two servers", 40) and finish == "length"
    finally:
        proc.stop()
        reap(kids)


async def test_each_stream_finds_a_connection_opened_ahead(
    start_llama: StartLlama, spawn_workers: SpawnWorkers, start_api: StartApi
) -> None:
    """llama.cpp's server closes a connection after each stream: the worker opens the
    next one while it has a free slot (a health check, kept alive), so a request's
    first token does not wait for a TCP handshake. Each stream rides a connection that
    a health check opened, none opens its own."""
    server = await start_llama(slots=2)
    proxy = RecordingProxy(server.port)
    url = await proxy.start()
    try:
        # no periodic health checks: only the worker's own opening ahead makes one
        settings = server.worker_settings(upstream_url=url, upstream_probe_seconds=60)
        await spawn_workers(1, **settings)
        api = await start_api()
        await ready_workers(api, 1)
        async with sdk(api.url) as through:
            for n in (1, 2):
                await wait_until(
                    lambda: Connection(["GET /health"], answers=1) in proxy.connections,
                    timeout=10,
                    what="a connection opened ahead of the next stream, and answered",
                )
                await streamed(through, f"stream {n}", 8)
        streams = [c.requests for c in proxy.connections if "POST /v1/completions" in c.requests]
        assert streams == [["GET /health", "POST /v1/completions"]] * 2, proxy.connections
    finally:
        await proxy.close()


async def test_a_cancel_frees_the_servers_slot(
    start_llama: StartLlama, spawn_workers: SpawnWorkers, start_api: StartApi
) -> None:
    server = await start_llama(slots=1, context=8192)
    await spawn_workers(1, **server.worker_settings())
    api = await start_api()
    await ready_workers(api, 1)
    max_tokens = 4000
    async with api.client() as client:
        body = {"model": MODEL, "prompt": "go on", "max_tokens": max_tokens, "temperature": 0}
        rid = (await client.post("/v1/requests", json=body)).json()["id"]
        await wait_until(lambda: _busy(server), timeout=30, what="the server's slot to be busy")
        assert (await client.delete(f"/v1/requests/{rid}")).status_code == 200
        await wait_until(lambda: _idle(server), timeout=30, what="the server's slot to be released")
        done = await wait_status(client, rid, "cancelled")
    # the server stopped generating when llmq closed the stream, long before max_tokens
    assert await server.predicted() < max_tokens / 2
    assert int(done["completion_tokens"]) < max_tokens / 2


async def test_a_worker_keeps_its_upstream_queue_filled_and_a_cancel_empties_it(
    start_llama: StartLlama, spawn_workers: SpawnWorkers, start_api: StartApi
) -> None:
    """``LLMQ_UPSTREAM_QUEUE``: the worker sends the server a request beyond its slots,
    which waits in the server's own queue. Cancelled there, it ends for its client
    at once, while the sequence ahead still runs; llama-server keeps it queued until a
    slot frees, then finds its connection closed and drops it within a token."""
    server = await start_llama(slots=1, context=8192)
    await spawn_workers(1, **server.worker_settings(upstream_queue=1))
    api = await start_api()
    await ready_workers(api, 1)
    async with api.client() as client:
        assert [w["concurrency"] for w in await workers(client)] == [2]  # slot + queue
        body = {"model": MODEL, "prompt": "go on", "max_tokens": 4000, "temperature": 0}
        ahead = (await client.post("/v1/requests", json=body)).json()["id"]
        await wait_until(lambda: _busy(server), timeout=30, what="the server's slot to be busy")
        queued = (await client.post("/v1/requests", json=body)).json()["id"]

        async def deferred(count: int) -> bool:
            return await server.deferred() == count

        await wait_until(lambda: deferred(1), timeout=30, what="a request in the server's queue")
        await wait_status(client, queued, "running")
        assert (await client.delete(f"/v1/requests/{queued}")).status_code == 200
        done = await wait_status(client, queued, "cancelled")
        assert (await record(client, ahead))["status"] == "running"  # still ahead of it
        assert int(done.get("completion_tokens") or 0) == 0
        assert (await client.delete(f"/v1/requests/{ahead}")).status_code == 200
        await wait_until(lambda: deferred(0), timeout=30, what="the server's queue to empty")
        await wait_until(lambda: _idle(server), timeout=30, what="the server's slot to be released")
        ended = await wait_status(client, ahead, "cancelled")
    # what the server generated: the sequence ahead (with the tokens in flight when it
    # was cancelled), not the 4000 of the one that waited behind it
    assert await server.predicted() < int(ended["completion_tokens"]) + 1000


async def _idle(server: LlamaServer) -> bool:
    return await server.busy() == 0


async def _busy(server: LlamaServer) -> bool:
    return await server.busy() > 0


@pytest.fixture(scope="session")
def multibyte_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model that also writes ``é``, as two byte tokens in one chunk."""
    shape = dataclasses.replace(SHAPE, multibyte=True)
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "multibyte.gguf", shape)


async def test_usage_and_max_tokens_count_the_servers_tokens_not_its_chunks(
    start_llama: StartLlama,
    spawn_workers: SpawnWorkers,
    start_api: StartApi,
    multibyte_gguf: Path,
) -> None:
    """llama-server holds a token that ends inside a character back and sends it with
    the next, in one chunk: the worker counts the engine's tokens (its running count,
    ``timings.predicted_n``), so the text, its length and the usage are the server's."""
    server = await start_llama(slots=1, model=multibyte_gguf)
    await spawn_workers(1, **server.worker_settings())
    api = await start_api()
    await ready_workers(api, 1)
    async with sdk(server.url) as direct_client, sdk(api.url) as through:
        want = await streamed(direct_client, "many bytes", 300)
        got = await streamed(through, "many bytes", 300)
        chat = [
            await c.chat.completions.create(
                model=MODEL, messages=CHATS[0], max_tokens=300, temperature=0
            )
            for c in (direct_client, through)
        ]
    assert "é" in want[0] and len(want[0]) < 300  # chunks of two tokens
    assert got[0] == want[0] and got[1] == want[1] == "length"
    assert got[2].completion_tokens == want[2].completion_tokens == 300
    assert _counts(chat[1].usage) == _counts(chat[0].usage)  # the cached part may differ
    assert chat[1].choices[0].message.content == chat[0].choices[0].message.content


async def test_a_request_without_max_tokens_runs_to_the_end_of_the_context(
    start_llama: StartLlama, spawn_workers: SpawnWorkers, start_api: StartApi
) -> None:
    """No max_tokens: what the context leaves, as the server itself gives it (not a
    default of a few tokens)."""
    server = await start_llama(slots=4, context=2048)  # 512 tokens per slot
    await spawn_workers(1, **server.worker_settings())
    api = await start_api(default_max_tokens=0)
    await ready_workers(api, 1)
    answers = []
    for url in (server.url, api.url):
        async with sdk(url) as client:
            answers.append(
                await client.completions.create(model=MODEL, prompt="a" * 300, temperature=0)
            )
    direct_answer, through = answers
    assert through.choices[0].text == direct_answer.choices[0].text
    assert through.choices[0].finish_reason == "length"
    assert through.usage is not None and direct_answer.usage is not None
    assert through.usage.completion_tokens == direct_answer.usage.completion_tokens > 150


@pytest.mark.parametrize("multibyte", [False, True], ids=["letters", "multibyte"])
async def test_a_killed_worker_resumes_on_the_other_and_the_text_is_unbroken(
    start_llama: StartLlama,
    spawn_workers: SpawnWorkers,
    start_api: StartApi,
    redis: Redis,
    multibyte_gguf: Path,
    multibyte: bool,
) -> None:
    """On the multi-byte model the resume's remaining budget is the engine's tokens:
    the text is the uninterrupted run's, to its length."""
    model = {"model": multibyte_gguf} if multibyte else {}
    servers = [await start_llama(slots=1, **model), await start_llama(slots=1, **model)]
    procs = [(await spawn_workers(1, lease_seconds=2, **s.worker_settings()))[0] for s in servers]
    api = await start_api()
    await ready_workers(api, 2)
    max_tokens = 1500
    want = await direct(servers[0].url, "resume me", max_tokens)

    killed: list[int] = []

    async def kill_mid_stream() -> bool:
        """SIGKILL the worker whose server is generating the request, mid-sequence."""
        for server, proc in zip(servers, procs, strict=True):
            if await server.decoded() >= 20:
                proc.signal(signal.SIGKILL)
                killed.append(proc.pid)
                return True
        return False

    async with api.client() as client, sdk(api.url) as through:
        killer = asyncio.create_task(
            wait_until(kill_mid_stream, timeout=30, what="a worker mid-stream", interval=0.002)
        )
        text, finish, usage = await streamed(through, "resume me", max_tokens)
        await killer
        records = [await record(client, k.rsplit(":", 1)[-1]) for k in await _requests(redis)]
    (final,) = records
    # 2 attempts, or more where a loaded machine let a lease lapse meanwhile
    assert f"-{killed[0]}-" not in final["worker"] and int(final["attempts"]) >= 2
    assert text == want, "the resumed text differs from an uninterrupted run"
    assert finish == "length" and usage.completion_tokens == max_tokens
    assert await redis.zcard(keys.running(MODEL)) == 0


async def _requests(redis: Redis) -> list[str]:
    return [k async for k in redis.scan_iter(keys.REQUESTS_GLOB)]


async def test_a_killed_server_hands_its_request_to_the_other_workers_server(
    start_llama: StartLlama, spawn_workers: SpawnWorkers, start_api: StartApi
) -> None:
    servers = [await start_llama(slots=1), await start_llama(slots=1)]
    for server in servers:
        await spawn_workers(1, **server.worker_settings())
    api = await start_api()
    await ready_workers(api, 2)
    max_tokens = 1500
    want = await direct(servers[1].url, "carry on", max_tokens)
    dead: list[LlamaServer] = []

    async def kill_mid_stream() -> bool:
        """SIGKILL the server generating the request, mid-sequence: a crashed engine."""
        for server in servers:
            if await server.decoded() >= 20:
                server.kill()
                dead.append(server)
                return True
        return False

    async with api.client() as client, sdk(api.url) as through:
        killer = asyncio.create_task(
            wait_until(kill_mid_stream, timeout=30, what="a server mid-stream", interval=0.002)
        )
        text, finish, _ = await streamed(through, "carry on", max_tokens)
        await killer
        assert text == want and finish == "length"

        async def one_unready() -> bool:
            # the worker of the dead server stays listed, not ready
            return sorted(w["ready"] for w in await workers(client)) == [False, True]

        await wait_until(one_unready, timeout=30, what="the dead server's worker to be unready")
        ready = (await client.get("/readyz")).json()
        assert (ready["workers"], ready["unready"]) == (1, 1)
        await dead[0].start()  # the engine comes back on its port: so does its worker

        async def all_ready() -> bool:
            return all(w["ready"] for w in await workers(client))

        await wait_until(all_ready, timeout=30, what="the worker to return with its server")


async def test_context_length_is_the_servers_and_a_longer_prompt_is_refused(
    start_llama: StartLlama, spawn_workers: SpawnWorkers, start_api: StartApi
) -> None:
    server = await start_llama(slots=2)  # 2048 tokens per slot
    await spawn_workers(1, **server.worker_settings())
    api = await start_api()
    await ready_workers(api, 1)
    client = sdk(api.url)
    # ~750 tokens by the API's estimate (chars), 3000 by the server's count: the worker
    # counts with the server, and refuses it: the request's fault, a 400 (not a 500)
    with pytest.raises(openai.APIError) as refused:
        await streamed(client, "a" * 3000, 10)
    assert "context length is 2048" in str(refused.value)
    assert refused.value.type == "invalid_request_error"
    assert refused.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as answered:
        await client.completions.create(model=MODEL, prompt="a" * 3000, max_tokens=10)
    assert answered.value.code == "context_length_exceeded"
    # over the context even by the estimate: refused at admission
    with pytest.raises(openai.BadRequestError) as admitted:
        await client.completions.create(model=MODEL, prompt="ab " * 3000, max_tokens=10)
    assert admitted.value.code == "context_length_exceeded"
    text, finish, _ = await streamed(client, "a" * 1000, 10)  # fits: served
    assert len(text) == 10 and finish == "length"
    await client.close()


async def test_a_prompt_the_server_refuses_is_the_clients_error_streamed_or_not(
    start_llama: StartLlama, spawn_workers: SpawnWorkers, start_api: StartApi
) -> None:
    """The chat template makes a prompt too long that llmq's plain rendering of it fits
    (no count asked of the server): the server's own 400 reaches the client as a 400 in
    OpenAI's shape, and as an ``invalid_request_error`` event in a stream."""
    server = await start_llama(slots=2)  # 2048 tokens per slot
    await spawn_workers(1, **server.worker_settings(upstream_api="chat"))
    api = await start_api()
    await ready_workers(api, 1)
    messages: list[Any] = [{"role": "user", "content": "a" * 2025}]
    async with sdk(api.url) as client:
        with pytest.raises(openai.BadRequestError) as answered:
            await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=5)
        with pytest.raises(openai.APIError) as streamed_error:
            await chat_text(client, messages, 5)
    assert answered.value.code == "context_length_exceeded"
    assert "exceeds the available context size" in answered.value.message
    assert answered.value.type == "invalid_request_error"
    assert streamed_error.value.type == "invalid_request_error"
    assert streamed_error.value.code == "context_length_exceeded"


async def test_priority_cap_and_queue_bound_as_with_the_mock(
    start_llama: StartLlama, spawn_workers: SpawnWorkers, start_api: StartApi, redis: Redis
) -> None:
    server = await start_llama(slots=1)
    await spawn_workers(1, **server.worker_settings())  # cap: the server's one slot
    api = await start_api(max_queue_depth=2)
    await ready_workers(api, 1)
    async with api.client() as client:

        async def submit(priority: int, max_tokens: int) -> httpx.Response:
            body = {"model": MODEL, "prompt": "wait", "max_tokens": max_tokens, "temperature": 0}
            return await client.post("/v1/requests", json={**body, "priority": priority})

        first = (await submit(0, 400)).json()["id"]
        await wait_status(client, first, "running")
        low = (await submit(5, 5)).json()["id"]
        high = (await submit(-5, 5)).json()["id"]
        full = await submit(0, 5)
        assert full.status_code == 429 and full.json()["error"]["code"] == "queue_full"
        assert int(await redis.zcard(keys.running(MODEL))) == 1  # the cap
        started = {
            rid: float((await wait_status(client, rid, "done", timeout=60))["started_at"])
            for rid in (first, low, high)
        }
    assert started[high] < started[low], "priority did not order the queue"


async def test_a_routed_workers_capacity_is_its_servers_slots(
    start_llama: StartLlama, spawn_workers: SpawnWorkers, start_api: StartApi, redis: Redis
) -> None:
    """The load guard of cache-aware routing weighs a worker by the slots it runs, the
    server's, not by ``LLMQ_CONCURRENCY`` (which the worker's cap is not, here)."""
    server = await start_llama(slots=2)
    await spawn_workers(1, **server.worker_settings(routing="prefix", concurrency=8))
    api = await start_api(routing="prefix")
    await ready_workers(api, 1)
    async with api.client() as client:
        (worker,) = await workers(client)
        assert worker["concurrency"] == 2
        beats = [worker["heartbeat_at"]]

        async def two_more_beats() -> bool:  # the second published its load after the first
            (now,) = await workers(client)
            if now["heartbeat_at"] > beats[-1]:
                beats.append(now["heartbeat_at"])
            return len(beats) > 2

        await wait_until(two_more_beats, timeout=20, what="two more heartbeats of the worker")
    load = await cast("Awaitable[str | None]", redis.hget(keys.loads(MODEL), worker["id"]))
    assert load == "0|2|0|0"  # capacity 2; no run has measured the pace yet


async def test_the_load_generator_reads_the_server_directly(start_llama: StartLlama) -> None:
    """llama-server closes a kept-alive connection after each stream without saying so:
    the load generator sends again on another connection instead of failing every other
    request (the benchmark's direct baseline depends on it)."""
    server = await start_llama(slots=2)
    config = LoadConfig(
        base_url=server.url,
        model=MODEL,
        num_requests=12,
        concurrency=1,
        prompt_tokens=(8, 8),
        output_tokens=(4, 4),
    )
    result = await run_load(config)
    summary = result.summary()
    errors = [r.error for r in result.measurements if r.error]
    assert (summary["completed"], summary["failed"]) == (12, 0), errors


async def test_a_hung_server_hands_its_request_to_the_other_worker(
    start_llama: StartLlama, spawn_workers: SpawnWorkers, start_api: StartApi
) -> None:
    """A server that stops answering (SIGSTOP: its connections stay open) is found by the
    health probe (within its 5 s timeout), long before the stalled stream's own timeout;
    its worker stops claiming and hands the request back, and it resumes on the other
    worker's server."""
    servers = [await start_llama(slots=1), await start_llama(slots=1)]
    for server in servers:
        await spawn_workers(1, **server.worker_settings(upstream_timeout_seconds=300))
    api = await start_api()
    await ready_workers(api, 2)
    max_tokens = 1500
    want = await direct(servers[1].url, "hang on", max_tokens)
    hung: list[LlamaServer] = []

    async def hang_mid_stream() -> bool:
        for server in servers:
            if await server.decoded() >= 20:
                server.pause(True)
                hung.append(server)
                return True
        return False

    async with api.client() as client, sdk(api.url) as through:
        pauser = asyncio.create_task(
            wait_until(hang_mid_stream, timeout=30, what="a server mid-stream", interval=0.002)
        )
        async with asyncio.timeout(60):  # the stalled stream alone would wait 300 s
            text, finish, _ = await streamed(through, "hang on", max_tokens)
        await pauser
        assert text == want and finish == "length"

        async def one_unready() -> bool:
            return sorted(w["ready"] for w in await workers(client)) == [False, True]

        await wait_until(one_unready, timeout=30, what="the hung server's worker to be unready")
        hung[0].pause(False)

        async def all_ready() -> bool:
            return all(w["ready"] for w in await workers(client))

        await wait_until(all_ready, timeout=30, what="the worker to return with its server")


async def test_stop_sequences_and_logprobs_pass_through(
    start_llama: StartLlama, spawn_workers: SpawnWorkers, start_api: StartApi
) -> None:
    """A stop sequence ends the text where the server ends it, with its finish reason;
    log-probabilities (declared: LLMQ_UPSTREAM_CAPABILITIES) are the server's own."""
    server = await start_llama(slots=2)
    await spawn_workers(1, **server.worker_settings(upstream_capabilities="logprobs"))
    api = await start_api()
    await ready_workers(api, 1)
    async with sdk(server.url) as direct_client, sdk(api.url) as through:
        full, _, _ = await streamed(direct_client, "stop here", 60)
        stop = full[20]  # a character the run writes: the text ends before it
        want = await streamed(direct_client, "stop here", 60, stop=[stop])
        got = await streamed(through, "stop here", 60, stop=[stop])
        assert got[0] == want[0] == full[: full.index(stop)]
        assert got[1] == want[1] == "stop"
        reply = await through.completions.create(
            model=MODEL, prompt="stop here", max_tokens=8, temperature=0, logprobs=2
        )
    (choice,) = reply.choices
    assert choice.text == full[:8] and choice.logprobs is not None
    assert choice.logprobs.tokens == list(full[:8])
    top = choice.logprobs.top_logprobs or []
    # greedy: each token is its own best alternative, with its own log-probability
    for token, logprob, alternatives in zip(
        choice.logprobs.tokens, choice.logprobs.token_logprobs or [], top, strict=True
    ):
        assert len(alternatives) == 2 and max(alternatives, key=alternatives.__getitem__) == token
        assert alternatives[token] == pytest.approx(logprob)


@pytest.mark.parametrize("multibyte", [False, True], ids=["letters", "multibyte"])
async def test_chat_uses_the_servers_template_and_a_rerun_continues_its_message(
    start_llama: StartLlama,
    spawn_workers: SpawnWorkers,
    start_api: StartApi,
    redis: Redis,
    multibyte_gguf: Path,
    multibyte: bool,
) -> None:
    """With LLMQ_UPSTREAM_API=chat the server's own chat template renders the messages;
    a re-run sends the text so far as the final assistant message, which the server
    continues (and echoes, which the worker drops): the client's text equals an
    uninterrupted run, on the multi-byte model to its length in tokens too."""
    model = {"model": multibyte_gguf} if multibyte else {}
    servers = [await start_llama(slots=1, **model), await start_llama(slots=1, **model)]
    settings = {"upstream_api": "chat", "lease_seconds": 2}
    procs = [(await spawn_workers(1, **s.worker_settings(**settings)))[0] for s in servers]
    api = await start_api()
    await ready_workers(api, 2)
    messages: list[Any] = [{"role": "user", "content": "tell me more"}]
    max_tokens = 1500
    async with sdk(servers[0].url) as direct_client:
        want = await chat_text(direct_client, messages, max_tokens)

    async def kill_mid_stream() -> bool:
        for server, proc in zip(servers, procs, strict=True):
            if await server.decoded() >= 20:
                proc.signal(signal.SIGKILL)
                return True
        return False

    async with sdk(api.url) as through:
        killer = asyncio.create_task(
            wait_until(kill_mid_stream, timeout=30, what="a worker mid-stream", interval=0.002)
        )
        got = await chat_text(through, messages, max_tokens)
        await killer
    differ = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
    assert got == want, f"{len(got)} vs {len(want)} characters, first difference at {differ}"
    assert "é" in got if multibyte else len(got) == max_tokens
    async with api.client() as client:
        (key,) = await _requests(redis)
        assert int((await record(client, key.rsplit(":", 1)[-1]))["attempts"]) >= 2


#: A function the random model calls as llama-server's grammar lets it. With
#: ``tool_choice`` "required" the grammar still allows text first (``>>>all``, then a
#: newline); the model never writes a byte token (a newline, a quote) where a letter is
#: allowed, so a function whose name goes on from ``all`` with a letter is its only way
#: on: the call is the model's, and its JSON the grammar's, filled in with the model's
#: letters. ``note`` is long, so that a call can be cut mid-arguments.
ALLOCATE: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "allocate_room",
        "description": "Book a room, with a note.",
        "parameters": {
            "type": "object",
            "properties": {
                "room": {"type": "string", "enum": ["blue", "green", "red"]},
                "note": {"type": "string", "minLength": 300, "maxLength": 300},
            },
            "required": ["room", "note"],
            "additionalProperties": False,
        },
    },
}

BOOK: list[Any] = [{"role": "user", "content": "book me a room"}]


@pytest.fixture(scope="session")
def tools_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "tools.jinja"
    path.write_text(TOOLS_CHAT_TEMPLATE)
    return path


#: A chat completion that must call ``allocate_room``.
CALL: dict[str, Any] = {
    "tools": [ALLOCATE],
    "tool_choice": "required",
    "parallel_tool_calls": False,
    "max_tokens": 1500,
    "temperature": 0,
}


async def calls(
    client: openai.AsyncOpenAI, messages: list[Any], *, stream: bool = False
) -> tuple[list[tuple[str, str, str]], str | None]:
    """The tool calls (id, name, arguments) of one :data:`CALL` completion, read from
    the stream or from the message, and its finish reason."""
    body = CALL
    if not stream:
        reply = await client.chat.completions.create(model=MODEL, messages=messages, **body)
        (choice,) = reply.choices
        made = [
            (c.id, c.function.name, c.function.arguments)
            for c in choice.message.tool_calls or ()
            if c.type == "function"
        ]
        return made, choice.finish_reason
    parts: dict[int, list[str]] = {}
    finish = None
    chunks = await client.chat.completions.create(
        model=MODEL, messages=messages, stream=True, **body
    )
    async for chunk in chunks:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or ():
                part = parts.setdefault(delta.index, ["", "", ""])
                part[0] += delta.id or ""
                if delta.function is not None:
                    part[1] += delta.function.name or ""
                    part[2] += delta.function.arguments or ""
            finish = choice.finish_reason or finish
    return [(i, n, a) for i, n, a in parts.values()], finish


async def test_tools_pass_through_and_the_servers_call_reaches_the_client(
    start_llama: StartLlama,
    spawn_workers: SpawnWorkers,
    start_api: StartApi,
    tools_template: Path,
) -> None:
    """A server whose chat template takes tools says so (/props): its worker declares
    ``tools`` unconfigured, forwards them, and relays the server's own call, streamed
    and not, as OpenAI's ``tool_calls`` with finish reason ``tool_calls`` (the server
    goes on to a second call, which llmq does not relay); the next turn (the call and
    its result) reaches the server as the chat API has it."""
    server = await start_llama(slots=1, chat_template=tools_template)
    await spawn_workers(1, **server.worker_settings(upstream_api="chat"))
    api = await start_api()
    await ready_workers(api, 1)
    async with api.client() as client:
        (entry,) = await workers(client)
    assert "tools" in entry["capabilities"]
    async with sdk(server.url) as direct_client, sdk(api.url) as through:
        made, _ = await calls(direct_client, BOOK)
        (_, name, want) = made[0]
        assert name == "allocate_room"
        jsonschema.validate(json.loads(want), ALLOCATE["function"]["parameters"])
        for stream in (False, True):
            (call,), finish = await calls(through, BOOK, stream=stream)
            assert call[1:] == ("allocate_room", want) and finish == "tool_calls"
            assert call[0]
        # llmq closed the stream at the second call, before the server's usage: the
        # prompt's count came early (llama.cpp's per-chunk timings), and is the server's
        counted = [
            (await c.chat.completions.create(model=MODEL, messages=BOOK, **CALL)).usage
            for c in (direct_client, through)
        ]
        assert counted[0] and counted[1]
        assert counted[1].prompt_tokens == counted[0].prompt_tokens
        call_id = call[0]
        history = [
            *BOOK,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "allocate_room", "arguments": want},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": "booked"},
        ]
        # the server renders the history with its template: the same prompt, the
        # same next call, only if the turn reached it as such
        made, _ = await calls(direct_client, history)
        ((_, _, after),), _ = await calls(through, history)
    assert after == made[0][2] != want


async def test_a_worker_without_tools_refuses_them(
    start_llama: StartLlama,
    spawn_workers: SpawnWorkers,
    start_api: StartApi,
    tools_template: Path,
) -> None:
    """A server whose template takes no tools (the model's own, plain ChatML) makes its
    worker declare none; a configured list overrides what a server says. ``tools``
    then gets the API's 400, as with any worker that lacks a capability."""
    plain = await start_llama(slots=1)
    able = await start_llama(slots=1, chat_template=tools_template)
    await spawn_workers(1, **plain.worker_settings(upstream_api="chat"))
    configured = able.worker_settings(upstream_api="chat", upstream_capabilities="logprobs")
    await spawn_workers(1, **configured)
    api = await start_api()
    await ready_workers(api, 2)
    async with api.client() as client:
        declared = sorted(tuple(w["capabilities"] or ()) for w in await workers(client))
    assert declared == [(), ("logprobs",)]
    async with sdk(api.url) as through:
        with pytest.raises(openai.BadRequestError) as refused:
            await calls(through, BOOK)
    assert refused.value.code == "unsupported_parameter"
    assert isinstance(refused.value.body, dict) and refused.value.body["param"] == "tools"


async def test_a_tool_call_cut_by_a_killed_worker_is_replayed_on_the_other(
    start_llama: StartLlama,
    spawn_workers: SpawnWorkers,
    start_api: StartApi,
    redis: Redis,
    tools_template: Path,
) -> None:
    """No engine continues a half-written call: the re-run replays the request from
    its start and passes on what follows the published tokens, so the client's call
    equals an uninterrupted one."""
    servers = [await start_llama(slots=1, chat_template=tools_template) for _ in range(2)]
    settings = {"upstream_api": "chat", "lease_seconds": 2}
    procs = [(await spawn_workers(1, **s.worker_settings(**settings)))[0] for s in servers]
    api = await start_api()
    await ready_workers(api, 2)
    async with sdk(servers[0].url) as direct_client:
        made, _ = await calls(direct_client, BOOK)
    want = made[0][2]

    async def kill_mid_call() -> bool:
        """SIGKILL the worker whose server is writing the call's note."""
        for server, proc in zip(servers, procs, strict=True):
            if await server.decoded() >= 120:
                proc.signal(signal.SIGKILL)
                return True
        return False

    async with sdk(api.url) as through:
        killer = asyncio.create_task(
            wait_until(kill_mid_call, timeout=30, what="a worker mid-call", interval=0.002)
        )
        (call,), finish = await calls(through, BOOK, stream=True)
        await killer
    assert call[1:] == ("allocate_room", want) and finish == "tool_calls"
    (key,) = await _requests(redis)
    entries = await redis.xrange(keys.stream(key.rsplit(":", 1)[-1]))
    events = [decode_event(fields) for _, fields in entries]
    runs = [i for i, e in enumerate(events) if isinstance(e, StartedEvent)]
    assert len(runs) >= 2
    # the first run had published the call's start and part of its arguments: the
    # replay passed on only the rest
    first = events[runs[0] : runs[1]]
    assert any(isinstance(e, ToolCallEvent) for e in first)
    assert any(isinstance(e, TokensEvent) for e in first)
