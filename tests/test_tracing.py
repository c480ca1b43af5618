"""OpenTelemetry traces through the queue, read back from a real trace backend
(Arize Phoenix, :mod:`tests.support.phoenix`): an API process and worker processes
in front of a scripted chat server (:mod:`tests.support.chat_upstream`), each sending
its spans by the standard ``OTEL_*`` variables.

One request is one trace: the client's ``traceparent`` continued by the API, carried
in the job across Redis, continued by the worker (a re-run after a worker's death
too) and sent to the engine.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from llmq.embedded import free_port
from llmq.policy import store
from llmq.protocol import keys
from tests.support.chat_upstream import (
    ARGUMENTS,
    ASK,
    NAME,
    TOOL,
    ChatUpstream,
    ScriptedCall,
)
from tests.support.native import wait_ready, workers
from tests.support.phoenix import Phoenix, Span, named, names, untraced_env
from tests.support.processes import Proc
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.timeout(240), pytest.mark.trace_backend]

MODEL = "scripted"
CUT = ARGUMENTS.index('"time"')
WHOLE = ScriptedCall("call_first", NAME, ARGUMENTS)
#: The first run stalls after CUT characters of its call: a run a test cuts.
HELD = ScriptedCall("call_first", NAME, ARGUMENTS, hold_after=CUT)


@dataclass
class Stack:
    upstream: ChatUpstream
    api_url: str
    workers: list[Proc]
    procs: list[Proc] = field(default_factory=list)


StartStack = Callable[..., Any]


@pytest.fixture
async def start_stack(redis_url: str) -> AsyncIterator[StartStack]:
    """The scripted server, ``n`` worker processes and an API process; ``otel``: the
    variables every llmq process gets."""
    made: list[Stack] = []

    async def start(answers: list[ScriptedCall], otel: dict[str, str], n: int = 1) -> Stack:
        upstream = await ChatUpstream(MODEL, answers).start()
        settings = upstream.worker_settings(lease_seconds=2, heartbeat_seconds=0.2)
        # claims in the queue's order, as the other tests' stacks (the scripted server
        # keeps no prefix cache: left unset, the pool derives least-loaded)
        pinned = {"LLMQ_ROUTING": "fifo", **otel}
        worker_env = untraced_env(
            LLMQ_REDIS_URL=redis_url,
            **{f"LLMQ_{k.upper()}": str(v) for k, v in settings.items()},
            **pinned,
        )
        procs = [Proc(["worker"], worker_env) for _ in range(n)]
        port = free_port()
        api = Proc(["api"], untraced_env(LLMQ_REDIS_URL=redis_url, LLMQ_PORT=str(port), **pinned))
        stack = Stack(upstream, f"http://127.0.0.1:{port}", procs, [*procs, api])
        made.append(stack)
        async with httpx.AsyncClient(base_url=stack.api_url) as client:
            await wait_ready(client, timeout=60)

            async def up() -> bool:
                return sum(bool(w["ready"]) for w in await workers(client)) == n

            await wait_until(up, timeout=60, what=f"{n} ready workers")
        return stack

    yield start
    for stack in made:
        await asyncio.gather(*(asyncio.to_thread(p.stop) for p in stack.procs))
        await stack.upstream.stop()


def client_context() -> tuple[str, str, str]:
    """A client's W3C ``traceparent``, with its trace id and span id."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


async def chat(
    stack: Stack,
    headers: dict[str, str],
    on_chunk: Callable[[dict[str, Any]], Awaitable[bool]] | None = None,
) -> str:
    """Stream a chat completion that calls the tool; its request id. ``on_chunk`` sees
    each chunk, and ends the stream early (the client goes away) by answering True."""
    body = {
        "model": MODEL,
        "messages": ASK,
        "tools": [TOOL],
        "tool_choice": "required",
        "stream": True,
    }
    rid = ""
    async with (
        httpx.AsyncClient(base_url=stack.api_url, timeout=60) as client,
        client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r,
    ):
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line.removeprefix("data: "))
            rid = chunk["id"].removeprefix("chatcmpl-")
            if on_chunk is not None and await on_chunk(chunk):
                break
    return rid


def by_name(spans: list[Span], name: str) -> Span:
    (span,) = named(spans, name)
    return span


def ids(span: Span) -> tuple[str, str | None]:
    return span["context"]["span_id"], span["parent_id"]


async def test_one_request_is_one_trace_from_the_client_to_the_engine(
    start_stack: StartStack, phoenix: Phoenix
) -> None:
    """The client's trace goes on through the API, the queue, the worker and its upstream
    call: every span in it, each a child of what caused it, in order, with the
    attributes that explain it."""
    stack = await start_stack([WHOLE], phoenix.otel_env())
    traceparent, trace_id, client_span = client_context()
    rid = await chat(stack, {"traceparent": traceparent})
    wanted = {"llmq.request", "llmq.admission", "llmq.relay", "llmq.queue_wait", "llmq.run"}
    wanted.add("llmq.engine")
    spans = await phoenix.wait_spans(trace_id, lambda s: wanted <= set(names(s)))
    request, admission = by_name(spans, "llmq.request"), by_name(spans, "llmq.admission")
    relay, waited = by_name(spans, "llmq.relay"), by_name(spans, "llmq.queue_wait")
    run, engine = by_name(spans, "llmq.run"), by_name(spans, "llmq.engine")
    # the client's span is the request's parent; the rest hang from it
    assert ids(request)[1] == client_span
    request_id = ids(request)[0]
    for child in (admission, relay, waited, run):
        assert ids(child)[1] == request_id, child["name"]
    assert ids(engine)[1] == ids(run)[0]
    # in order: admitted (the wait starts at the enqueue time, taken just before the
    # admission's script call), waited, run (the engine's call inside it), relayed
    assert request["start_time"] <= admission["start_time"] <= waited["end_time"]
    assert request["start_time"] <= waited["start_time"]
    assert waited["end_time"] <= run["start_time"] <= engine["start_time"]
    assert engine["end_time"] <= run["end_time"]
    # the answer is relayed once admitted, until the request ends (the run's span ends
    # after its terminal write, which the relay may have sent on already)
    assert admission["end_time"] <= relay["start_time"] <= relay["end_time"]
    assert relay["end_time"] <= request["end_time"]
    # what each says
    assert request["attributes"]["http.request.method"] == "POST"
    assert request["attributes"]["http.response.status_code"] == 200
    assert admission["attributes"]["llmq.request.id"] == rid
    assert admission["attributes"]["gen_ai.request.model"] == MODEL
    assert admission["attributes"]["llmq.admission.queued"] is True
    assert admission["attributes"]["llmq.priority.band"] == "live"
    for span in (waited, run):
        assert span["attributes"]["llmq.request.id"] == rid
        assert span["attributes"]["llmq.attempt"] == 1
        assert f"-{stack.workers[0].pid}-" in span["attributes"]["llmq.worker.id"]
        assert span["attributes"]["llmq.routing"] == "fifo"
    assert run["attributes"]["gen_ai.response.finish_reasons"] == ["stop"]
    assert run["attributes"]["gen_ai.usage.output_tokens"] == len(ARGUMENTS)
    assert run["attributes"]["gen_ai.request.max_tokens"] > 0
    assert [e["name"] for e in run["events"]] == ["llmq.first_token"]
    assert engine["attributes"]["gen_ai.request.model"] == MODEL
    assert engine["attributes"]["url.full"].endswith("/v1/chat/completions")
    # llmq's spans alone: not a second server span of the framework's beside llmq.request
    assert [s["name"] for s in spans if not s["name"].startswith("llmq.")] == []


async def test_the_engine_receives_the_trace_context_of_its_call(
    start_stack: StartStack, phoenix: Phoenix
) -> None:
    """The upstream request carries ``traceparent``: the run's trace, the ``llmq.engine``
    span as parent, so that the engine's own spans join the trace."""
    stack = await start_stack([WHOLE], phoenix.otel_env())
    traceparent, trace_id, _ = client_context()
    await chat(stack, {"traceparent": traceparent})
    (headers,) = stack.upstream.headers
    version, sent_trace, sent_parent, flags = headers["traceparent"].split("-")
    assert (version, sent_trace, flags) == ("00", trace_id, "01")
    spans = await phoenix.wait_spans(trace_id, lambda s: "llmq.engine" in names(s))
    assert ids(by_name(spans, "llmq.engine"))[0] == sent_parent


async def test_with_tracing_off_no_span_is_made_and_no_context_is_queued(
    start_stack: StartStack, phoenix: Phoenix, redis: Redis
) -> None:
    """``OTEL_SDK_DISABLED=true`` beside an exporter's endpoint: no span reaches the
    backend, the job carries no trace context and the engine gets no ``traceparent``."""
    otel = {**phoenix.otel_env(), "OTEL_SDK_DISABLED": "true"}
    stack = await start_stack([HELD], otel)
    traceparent, trace_id, _ = client_context()
    jobs: list[dict[str, Any]] = []

    async def read_job(chunk: dict[str, Any]) -> bool:
        """The running request's job, then the client goes away (the run is cancelled)."""
        raw = await redis.get(keys.job(chunk["id"].removeprefix("chatcmpl-"), MODEL))
        assert raw is not None
        jobs.append(json.loads(raw)["k"]["payload"])
        return True

    await chat(stack, {"traceparent": traceparent}, read_job)
    assert jobs and "trace" not in jobs[0]
    assert all("traceparent" not in h for h in stack.upstream.headers)
    # the processes stop (a tracing process would flush what it holds), then: nothing
    for proc in stack.procs:
        await asyncio.to_thread(proc.stop)
    assert await phoenix.spans(trace_id) == []


@pytest.mark.slow
async def test_a_re_run_after_a_worker_is_killed_goes_on_in_the_same_trace(
    start_stack: StartStack, phoenix: Phoenix
) -> None:
    """The worker running the request is SIGKILLed mid-call; the worker that resumes it
    continues the trace the job carries: a second ``llmq.queue_wait`` and ``llmq.run``
    (attempt 2, another worker) beside the first attempt's."""
    stack = await start_stack([HELD, WHOLE], phoenix.otel_env(), n=2)
    traceparent, trace_id, _ = client_context()
    killed: list[str] = []

    async def kill_holder(chunk: dict[str, Any]) -> bool:
        if killed:
            return False
        # the first attempt's queue wait is exported (it ended at the claim)
        spans = await phoenix.wait_spans(trace_id, lambda s: "llmq.queue_wait" in names(s))
        holder = by_name(spans, "llmq.queue_wait")["attributes"]["llmq.worker.id"]
        (proc,) = [p for p in stack.workers if f"-{p.pid}-" in holder]
        proc.signal(signal.SIGKILL)
        killed.append(holder)
        return False

    await chat(stack, {"traceparent": traceparent}, kill_holder)
    assert killed

    def resumed(spans: list[Span]) -> bool:
        # each process exports in its own batches: the API's request span may come last
        return (
            len(named(spans, "llmq.queue_wait")) == 2
            and bool(named(spans, "llmq.run"))
            and bool(named(spans, "llmq.request"))
        )

    spans = await phoenix.wait_spans(trace_id, resumed)
    first, second = named(spans, "llmq.queue_wait")
    (run,) = named(spans, "llmq.run")  # the killed worker's run never ended: not exported
    assert first["attributes"]["llmq.attempt"] == 1
    assert first["attributes"]["llmq.worker.id"] == killed[0]
    assert second["attributes"]["llmq.attempt"] == run["attributes"]["llmq.attempt"] == 2
    assert run["attributes"]["llmq.worker.id"] not in killed
    request_id = ids(by_name(spans, "llmq.request"))[0]
    assert ids(first)[1] == ids(second)[1] == ids(run)[1] == request_id


async def test_a_batch_lines_trace_is_rooted_in_its_line_through_the_worker(
    start_stack: StartStack, phoenix: Phoenix
) -> None:
    """A batch line is a trace of its own: a ``llmq.batch_line`` root naming its batch,
    and under it the line's admission, its queue wait and its run in the worker, whose
    engine call hangs from the run."""
    stack = await start_stack([WHOLE], phoenix.otel_env())
    body = {"model": MODEL, "messages": ASK, "tools": [TOOL], "tool_choice": "required"}
    line = {"custom_id": "line-1", "method": "POST", "url": "/v1/chat/completions", "body": body}
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=30) as client:
        uploaded = await client.post(
            "/v1/files",
            data={"purpose": "batch"},
            files={"file": ("lines.jsonl", json.dumps(line) + "\n")},
        )
        assert uploaded.status_code == 200, uploaded.text
        created = await client.post(
            "/v1/batches",
            json={
                "input_file_id": uploaded.json()["id"],
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
        )
        assert created.status_code == 200, created.text
        batch_id = created.json()["id"]
        ended: dict[str, Any] = {}

        async def completed() -> bool:
            ended.update((await client.get(f"/v1/batches/{batch_id}")).json())
            return bool(ended["status"] == "completed")

        await wait_until(completed, timeout=60, what="the batch to complete")
        output = await client.get(f"/v1/files/{ended['output_file_id']}/content")
    (result,) = [json.loads(raw) for raw in output.text.splitlines()]
    rid = result["response"]["request_id"]

    async def line_root() -> bool:
        roots = await phoenix.named("llmq.batch_line")
        return any(r["attributes"]["llmq.batch.id"] == batch_id for r in roots)

    await wait_until(line_root, timeout=30, what="the batch line's root span")
    (root,) = [
        r
        for r in await phoenix.named("llmq.batch_line")
        if r["attributes"]["llmq.batch.id"] == batch_id
    ]
    assert root["parent_id"] is None
    wanted = {"llmq.admission", "llmq.queue_wait", "llmq.run", "llmq.engine"}
    trace_id = root["context"]["trace_id"]
    spans = await phoenix.wait_spans(trace_id, lambda s: wanted <= set(names(s)))
    admission, waited = by_name(spans, "llmq.admission"), by_name(spans, "llmq.queue_wait")
    run, engine = by_name(spans, "llmq.run"), by_name(spans, "llmq.engine")
    for child in (admission, waited, run):
        assert ids(child)[1] == ids(root)[0], child["name"]
        assert child["attributes"]["llmq.batch.id"] == batch_id
        assert child["attributes"]["llmq.request.id"] == rid
    assert ids(engine)[1] == ids(run)[0]
    assert admission["attributes"]["llmq.priority.band"] == "batch"
    assert f"-{stack.workers[0].pid}-" in run["attributes"]["llmq.worker.id"]
    assert waited["end_time"] <= run["start_time"] <= engine["start_time"]
    assert run["attributes"]["gen_ai.response.finish_reasons"] == ["stop"]


async def test_a_routed_claims_matched_blocks_are_on_its_queue_wait(
    redis_url: str, phoenix: Phoenix
) -> None:
    """Under the prefix policy, a request claimed behind a run of the same prompt
    prefix: its ``llmq.queue_wait`` says how many of its prompt's leading KV blocks the
    claiming worker held (all 4: the first run cached them), and that it went before
    the one request queued ahead of it (``llmq.admission`` says it found one there)."""
    env = {**phoenix.otel_env(), "LLMQ_ROUTING": "prefix"}
    worker = Proc(
        ["worker"],
        untraced_env(
            LLMQ_REDIS_URL=redis_url,
            LLMQ_CONCURRENCY="1",
            LLMQ_MODEL_TOKENS_PER_SECOND="100",
            LLMQ_HEARTBEAT_SECONDS="0.2",
            **env,
        ),
    )
    port = free_port()
    api = Proc(["api"], untraced_env(LLMQ_REDIS_URL=redis_url, LLMQ_PORT=str(port), **env))
    prefix = " ".join(f"w{i}" for i in range(64))  # 4 blocks of 16
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            await wait_ready(client, timeout=60)

            async def up() -> bool:
                return any(w["ready"] for w in await workers(client))

            await wait_until(up, timeout=60, what="a ready worker")
            body = {"model": "mock", "max_tokens": 40, "ignore_eos": True}
            first = await client.post("/v1/requests", json={**body, "prompt": f"{prefix} one"})
            assert first.status_code == 202, first.text
            other = await client.post("/v1/requests", json={**body, "prompt": "elsewhere"})
            assert other.status_code == 202, other.text
            traceparent, trace_id, _ = client_context()
            second = await client.post(
                "/v1/requests",
                json={**body, "prompt": f"{prefix} two", "max_tokens": 4},
                headers={"traceparent": traceparent},
            )
            assert second.status_code == 202, second.text
        spans = await phoenix.wait_spans(
            trace_id, lambda s: {"llmq.queue_wait", "llmq.admission"} <= set(names(s))
        )
        waited = by_name(spans, "llmq.queue_wait")
        assert waited["attributes"]["llmq.routing"] == "prefix"
        assert waited["attributes"]["llmq.claim.matched_blocks"] == 4
        assert waited["attributes"]["llmq.queue.overtook"] == 1  # "elsewhere", for its cache
        assert by_name(spans, "llmq.admission")["attributes"]["llmq.queue.ahead"] == 1
    finally:
        await asyncio.gather(*(asyncio.to_thread(p.stop) for p in (api, worker)))


async def test_a_queue_wait_carries_the_policy_version_and_values_it_was_claimed_under(
    redis_url: str, redis: Redis, phoenix: Phoenix
) -> None:
    """A policy change between two requests: the second's ``llmq.queue_wait`` names the
    new version and the live policy's fairness, not what the worker started with."""
    env = phoenix.otel_env()
    worker = Proc(
        ["worker"],
        untraced_env(LLMQ_REDIS_URL=redis_url, LLMQ_HEARTBEAT_SECONDS="0.2", **env),
    )
    port = free_port()
    api = Proc(["api"], untraced_env(LLMQ_REDIS_URL=redis_url, LLMQ_PORT=str(port), **env))
    body = {"model": "mock", "max_tokens": 4, "prompt": "hello there"}
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            await wait_ready(client, timeout=60)

            async def traced() -> Span:
                traceparent, trace_id, _ = client_context()
                r = await client.post(
                    "/v1/completions", json=body, headers={"traceparent": traceparent}
                )
                assert r.status_code == 200, r.text
                spans = await phoenix.wait_spans(trace_id, lambda s: "llmq.run" in names(s))
                return by_name(spans, "llmq.queue_wait")

            before = await traced()
            assert before["attributes"]["llmq.fairness"] == "vtc"
            version = await store.set_values(redis, {"fairness": "fifo"}, None, "tests")

            async def followed() -> bool:  # the worker claims under the new version
                return bool((await traced())["attributes"]["llmq.policy.version"] == version)

            await wait_until(followed, timeout=10, what="a claim under the new version")
            after = await traced()
        assert before["attributes"]["llmq.policy.version"] < version
        assert after["attributes"]["llmq.policy.version"] == version
        assert after["attributes"]["llmq.fairness"] == "fifo"
    finally:
        await asyncio.gather(*(asyncio.to_thread(p.stop) for p in (api, worker)))
