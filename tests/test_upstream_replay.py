"""A re-run of a request that offers tools replays it from its start and passes on
only what follows the published tokens (``docs/backends.md``, "Tool calls"): worker
processes in front of a scripted chat server (:mod:`tests.support.chat_upstream`),
end to end through llmq with the openai SDK.

llama.cpp's server (``tests/test_upstream.py``) replays the same call, so it cannot
show the other case: a replay that writes another call. Here the server's first run
writes part of a call and stalls, the worker running it is killed, and the server
answers the replays as the test scripted them.
"""

from __future__ import annotations

import json
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import openai
import pytest
from redis.asyncio import Redis

from llmq.protocol import keys
from tests.support.chat_upstream import (
    ARGUMENTS,
    ASK,
    NAME,
    TOOL,
    ChatUpstream,
    ScriptedCall,
)
from tests.support.native import ready_workers, record
from tests.support.processes import Proc
from tests.support.servers import RunningApi, SpawnWorkers, StartApi

pytestmark = pytest.mark.timeout(120)

MODEL = "scripted"
MAX_TRIES = 3
#: Another call: it differs from ARGUMENTS at the party, within what is published.
OTHER = json.dumps({"party": 2, "time": "19:30"})
#: The first run's arguments the client has when the worker dies: past the party.
CUT = ARGUMENTS.index('"time"')

#: The first run: the call's start and its arguments up to CUT, then a stall.
FIRST = ScriptedCall("call_first", NAME, ARGUMENTS, hold_after=CUT)

StartUpstream = Callable[[Sequence[ScriptedCall]], Awaitable[ChatUpstream]]


@pytest.fixture
async def start_upstream() -> AsyncIterator[StartUpstream]:
    upstreams: list[ChatUpstream] = []

    async def start(answers: Sequence[ScriptedCall]) -> ChatUpstream:
        upstream = ChatUpstream(MODEL, answers)
        upstreams.append(upstream)
        return await upstream.start()

    yield start
    for upstream in upstreams:
        await upstream.stop()


@dataclass
class Streamed:
    """What the client got of a streamed chat completion (kept when it raises)."""

    request_id: str = ""
    #: Per call index: its id, name and arguments, each as the deltas concatenate them.
    calls: dict[int, list[str]] = field(default_factory=dict)
    finish: str | None = None
    #: The pid of the worker killed mid-call.
    killed: int | None = None

    @property
    def arguments(self) -> str:
        """The first call's arguments so far."""
        return self.calls[0][2] if 0 in self.calls else ""


async def stream_cut_call(api: RunningApi, procs: list[Proc], got: Streamed) -> None:
    """Stream a chat completion that must call the tool; once the client has
    the first run's arguments up to CUT, SIGKILL the worker running it."""
    async with api.sdk() as through, api.client() as client:
        body: dict[str, Any] = {"tools": [TOOL], "tool_choice": "required", "temperature": 0}
        stream = await through.chat.completions.create(
            model=MODEL, messages=ASK, stream=True, **body
        )
        async for chunk in stream:
            got.request_id = chunk.id.removeprefix("chatcmpl-")
            for choice in chunk.choices:
                for delta in choice.delta.tool_calls or ():
                    part = got.calls.setdefault(delta.index, ["", "", ""])
                    part[0] += delta.id or ""
                    if delta.function is not None:
                        part[1] += delta.function.name or ""
                        part[2] += delta.function.arguments or ""
                got.finish = choice.finish_reason or got.finish
            if got.killed is None and len(got.arguments) >= CUT:
                holder = (await record(client, got.request_id))["worker"]
                (proc,) = [p for p in procs if f"-{p.pid}-" in holder]
                proc.signal(signal.SIGKILL)
                got.killed = proc.pid


async def stack(
    start_upstream: StartUpstream,
    spawn_workers: SpawnWorkers,
    start_api: StartApi,
    replay: ScriptedCall,
) -> tuple[ChatUpstream, list[Proc], RunningApi]:
    """The scripted server (FIRST, then ``replay`` for every re-run), two workers in
    front of it, and the API."""
    upstream = await start_upstream([FIRST, replay])
    settings = upstream.worker_settings(lease_seconds=2, max_tries=MAX_TRIES)
    procs = await spawn_workers(2, **settings)
    api = await start_api()
    await ready_workers(api, 2)
    return upstream, procs, api


async def assert_nothing_left(redis: Redis, request_id: str) -> None:
    """The request holds no place in the model's queue or running set, nor a lease."""
    assert await redis.zcard(keys.running(MODEL)) == 0
    assert await redis.zcard(keys.queue(MODEL)) == 0
    assert await redis.hlen(keys.leases(MODEL)) == 0  # type: ignore[misc]
    for key in (keys.job, keys.in_progress, keys.retry):
        assert not await redis.exists(key(request_id, MODEL)), key.__name__


@pytest.mark.slow
async def test_a_replay_that_writes_another_call_fails_the_request_never_splices(
    start_upstream: StartUpstream,
    spawn_workers: SpawnWorkers,
    start_api: StartApi,
    redis: Redis,
) -> None:
    """Every re-run replays the request and the server writes another call: each
    attempt fails (the replay diverges), up to LLMQ_MAX_TRIES, and the request ends
    with ``model_error``; the client has the first run's part of its call and an
    error in OpenAI's shape, nothing of the other call."""
    other = ScriptedCall("call_other", NAME, OTHER)
    upstream, procs, api = await stack(start_upstream, spawn_workers, start_api, other)
    got = Streamed()
    with pytest.raises(openai.APIError) as failed:
        await stream_cut_call(api, procs, got)
    assert failed.value.code == "model_error", failed.value.body
    assert got.killed is not None
    assert got.calls == {0: ["call_first", NAME, ARGUMENTS[:CUT]]}
    assert got.finish is None
    async with api.client() as client:
        final = await record(client, got.request_id)
    assert final["status"] == "failed" and final["finish_reason"] == "error"
    assert "the replay's token" in final["error"], final["error"]
    assert int(final["attempts"]) == MAX_TRIES
    assert f"-{got.killed}-" not in final["worker"]
    # one upstream request per attempt, each the request from its start
    assert len(upstream.requests) == MAX_TRIES
    assert all(body == upstream.requests[0] for body in upstream.requests)
    assert "continue_final_message" not in upstream.requests[0]
    await assert_nothing_left(redis, got.request_id)


@pytest.mark.slow
async def test_a_replay_that_writes_the_same_call_completes_it_once(
    start_upstream: StartUpstream,
    spawn_workers: SpawnWorkers,
    start_api: StartApi,
    redis: Redis,
) -> None:
    """The server replays the same call (under an id of its own, as engines give each
    answer one): the client gets the call once, with the first run's id, and its
    arguments whole, neither repeated nor cut."""
    same = ScriptedCall("call_replayed", NAME, ARGUMENTS)
    upstream, procs, api = await stack(start_upstream, spawn_workers, start_api, same)
    got = Streamed()
    await stream_cut_call(api, procs, got)
    assert got.killed is not None
    assert got.calls == {0: ["call_first", NAME, ARGUMENTS]}
    assert got.finish == "tool_calls"
    async with api.client() as client:
        final = await record(client, got.request_id)
    assert final["status"] == "done" and int(final["attempts"]) == 2
    assert f"-{got.killed}-" not in final["worker"]
    (first, replayed) = upstream.requests
    assert replayed == first and "continue_final_message" not in replayed
    assert [t["function"]["name"] for t in first["tools"]] == [NAME]
    await assert_nothing_left(redis, got.request_id)
