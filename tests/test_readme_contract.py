"""What the README and docs/ promise a client, each checked end to end against a real API
and worker.

Fields, codes and settings that no other test would miss: ``stop`` and the stop
probability ending with ``finish_reason: "stop"``, unknown fields ignored,
``events_url``, ``run_ms``, ``?last_event_id=``, ``context_length_exceeded``,
``model_not_found``, a non-streaming model error (500), the fields of
``/v1/workers``, the open endpoints, an unset ``max_tokens`` (what the context leaves),
and the settings ``LLMQ_DEFAULT_MAX_TOKENS``, ``LLMQ_SSE_KEEPALIVE_SECONDS`` and
``LLMQ_JOB_TIMEOUT_SECONDS``.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from llmq.model.interface import Backend, GenerationRequest, Output
from llmq.model.tokenizer import count_tokens
from llmq.protocol import keys
from llmq.settings import WorkerSettings
from tests.support.exposition import value
from tests.support.models import Flaky
from tests.support.native import post_request, record, wait_ready, wait_status
from tests.support.servers import FAST_MODEL, RunningApi, StartApi, StartWorker
from tests.support.sse import frames, openai_chunks
from tests.support.waiting import wait_until
from worker.backends import mock_backend

pytestmark = pytest.mark.timeout(30)

DOCS = Path(__file__).resolve().parent.parent / "docs"
#: The pages whose statements these tests check against what the API does.
API_PAGE = (DOCS / "api.md").read_text()
SECURITY_PAGE = (DOCS / "security.md").read_text()


async def test_a_stop_sequence_ends_the_text_before_it_with_finish_reason_stop(
    stack: RunningApi,
) -> None:
    body = {"model": "mock", "prompt": "say things", "max_tokens": 12, "seed": 4}
    async with stack.client() as client:
        full = (await client.post("/v1/completions", json=body)).json()
        words = full["choices"][0]["text"].split()
        stop = words[5]
        cut = words.index(stop)  # its first occurrence
        stopped = (await client.post("/v1/completions", json={**body, "stop": [stop]})).json()
        async with client.stream(
            "POST", "/v1/completions", json={**body, "stop": stop, "stream": True}
        ) as r:
            chunks = await openai_chunks(r)
    assert full["choices"][0]["finish_reason"] == "length"
    assert stopped["choices"][0]["finish_reason"] == "stop"
    assert stopped["choices"][0]["text"].split() == words[:cut]
    assert stopped["usage"]["completion_tokens"] == cut
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "stop"


async def test_the_stop_probability_ends_generations_early_with_stop(
    start_api: StartApi, start_worker: StartWorker
) -> None:
    await start_worker(model_stop_probability=0.3)
    api = await start_api()
    async with api.client() as client:
        await wait_ready(client)
        answers = [
            (
                await client.post(
                    "/v1/completions",
                    json={"model": "mock", "prompt": "p", "max_tokens": 40, "seed": seed},
                )
            ).json()
            for seed in range(3)
        ]
    for answer in answers:  # P(40 tokens without a stop) = 0.7**40, about 6e-7
        assert answer["choices"][0]["finish_reason"] == "stop"
        assert answer["usage"]["completion_tokens"] < 40


async def test_unknown_fields_are_ignored(stack: RunningApi) -> None:
    extra = {"logit_bias": {"50256": -100}, "user": "u-1", "frequency_penalty": 0, "x_new": [1]}
    async with stack.client() as client:
        plain = await client.post(
            "/v1/completions", json={"model": "mock", "prompt": "p", "max_tokens": 2, **extra}
        )
        chat = await client.post(
            "/v1/chat/completions",
            json={
                "model": "mock",
                "messages": [{"role": "user", "content": "hi", "name": "n"}],
                "max_tokens": 2,
                **extra,
            },
        )
        native = await client.post(
            "/v1/requests", json={"model": "mock", "prompt": "p", "max_tokens": 2, **extra}
        )
    assert (plain.status_code, chat.status_code, native.status_code) == (200, 200, 202)


async def test_events_url_run_ms_and_last_event_id_in_the_query(stack: RunningApi) -> None:
    async with stack.client() as client:
        created = await client.post(
            "/v1/requests", json={"model": "mock", "prompt": "p", "max_tokens": 20}
        )
        events_url = created.json()["events_url"]
        async with client.stream("GET", events_url) as r:
            everything = [f async for f in frames(r)]
        rid = created.json()["id"]
        done = await record(client, rid)
        cut = everything[1].id  # after "started" and the first tokens event
        async with client.stream("GET", f"{events_url}?last_event_id={cut}") as r:
            rest = [f async for f in frames(r)]
    assert events_url == f"/v1/requests/{rid}/events"
    assert everything[0].event == "started" and everything[-1].event == "done"
    assert [f.id for f in rest] == [f.id for f in everything[2:]]
    # 20 tokens at 200 tokens/s: at least the 19 intervals after the first token
    assert done["run_ms"] >= 19 / 200 * 1000
    assert done["run_ms"] == pytest.approx(
        (done["finished_at"] - done["started_at"]) * 1000, abs=0.01
    )
    assert done["queue_ms"] >= 0


async def test_context_length_exceeded_and_model_not_found(start_api: StartApi, stack: Any) -> None:
    api = await start_api(max_prompt_tokens=5)
    async with api.client() as client:
        await wait_ready(client)
        long = await client.post(
            "/v1/completions", json={"model": "mock", "prompt": "one two three four five six"}
        )
        fits = await client.post(
            "/v1/completions",
            json={"model": "mock", "prompt": "one two three four five", "max_tokens": 1},
        )
        unknown = await client.post("/v1/completions", json={"model": "nope", "prompt": "p"})
    assert long.status_code == 400
    assert long.json()["error"]["code"] == "context_length_exceeded"
    assert long.json()["error"]["param"] == "prompt"
    assert fits.status_code == 200
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "model_not_found"
    assert unknown.json()["error"]["param"] == "model"


async def test_a_non_streaming_model_error_is_a_500_with_model_error(
    start_api: StartApi, start_worker: StartWorker
) -> None:
    await start_worker(backend=Flaky(), max_tries=1)
    api = await start_api()
    async with api.client() as client:
        await wait_ready(client)
        r = await client.post(
            "/v1/completions", json={"model": "mock", "prompt": "explode", "max_tokens": 10}
        )
    assert r.status_code == 500
    assert r.json()["error"]["code"] == "model_error"
    assert r.json()["error"]["type"] == "server_error"
    assert re.search(r"^\| 500 \|.*`model_error`", API_PAGE, re.MULTILINE)


async def test_workers_lists_the_fields_the_readme_names(stack: RunningApi) -> None:
    async with stack.client() as client:
        rid = await post_request(client, "p", max_tokens=200)
        await wait_status(client, rid, "running")
        listed: list[dict[str, Any]] = []

        async def beat_counts_it() -> bool:  # the count comes with the next heartbeat
            listed[:] = (await client.get("/v1/workers")).json()["data"]
            return bool(listed[0]["running"] == 1)

        await wait_until(beat_counts_it, timeout=5, what="the heartbeat to count the request")
        (worker,) = listed
    assert set(worker) == {
        "id",
        "host",
        "pid",
        "model",
        "concurrency",
        "running",
        "started_at",
        "heartbeat_at",
        "capabilities",
        "kv_cache_usage",
        "prefix_cache",
        "prefix_cache_queries",
        "prefix_cache_hits",
        "tokenizer",
        "context_length",
        "ready",
        "upstream",
        "draining",
    }
    # the model's declaration (docs/backends.md): the mock counts whitespace words, has
    # no upstream engine and keeps a prefix cache
    assert (
        worker["tokenizer"],
        worker["context_length"],
        worker["ready"],
        worker["upstream"],
        worker["prefix_cache"],
    ) == ("whitespace", None, True, None, True)
    assert worker["model"] == "mock" and worker["concurrency"] == 8
    assert worker["running"] == 1
    assert worker["started_at"] <= worker["heartbeat_at"] <= time.time()


async def test_only_the_endpoints_the_readme_lists_as_open_answer_without_a_key(
    start_api: StartApi, start_worker: StartWorker
) -> None:
    await start_worker()
    api = await start_api(api_keys="sk-k")
    routes = [
        (method.upper(), path.replace("{request_id}", "f" * 32))
        for path, methods in api.responses.app.openapi()["paths"].items()
        for method in methods
    ]
    assert len(routes) >= 12
    opened: set[str] = set()
    async with api.client() as client:
        await wait_ready(client)
        for method, path in routes:
            if (await client.request(method, path, json={})).status_code != 401:
                opened.add(path)
    listed = set(
        re.findall(r"`(/[a-z0-9/]+)`", SECURITY_PAGE.split("stay open", 1)[0].rsplit(".", 1)[1])
    )
    assert opened == listed == {"/healthz", "/readyz", "/metrics", "/v1/metrics/summary"}


async def _without_max_tokens(api: RunningApi, prompt: str = "p") -> dict[str, Any]:
    async with api.client() as client:
        await wait_ready(client)
        r = await client.post("/v1/completions", json={"model": "mock", "prompt": prompt})
    answer: dict[str, Any] = r.json()
    return answer


async def test_default_max_tokens_applies_when_a_request_sets_none(
    start_api: StartApi, start_worker: StartWorker
) -> None:
    await start_worker()
    answer = await _without_max_tokens(await start_api(default_max_tokens=7, max_tokens_limit=20))
    assert answer["usage"]["completion_tokens"] == 7
    assert answer["choices"][0]["finish_reason"] == "length"


class WithContext:
    """The mock behind a context length of ``length`` tokens."""

    def __init__(self, mock: Backend, length: int) -> None:
        self.mock, self.context_length = mock, length

    def count_tokens(self, text: str) -> int:
        return self.mock.count_tokens(text)

    def generate(self, request: GenerationRequest) -> AsyncIterator[Output]:
        return self.mock.generate(request)


async def test_a_request_without_max_tokens_gets_what_the_context_leaves(
    start_api: StartApi, start_worker: StartWorker
) -> None:
    mock = mock_backend(WorkerSettings.model_validate(FAST_MODEL))  # never stops by itself
    await start_worker(backend=WithContext(mock, 24))
    api = await start_api(default_max_tokens=0, max_tokens_limit=8)
    answer = await _without_max_tokens(api, "a b c d")
    # 24 - 4 prompt tokens: not the limit of explicit max_tokens (8), as vLLM does
    assert answer["usage"]["completion_tokens"] == 20
    assert answer["choices"][0]["finish_reason"] == "length"


async def test_without_a_context_length_a_request_without_max_tokens_gets_the_limit(
    start_api: StartApi, start_worker: StartWorker
) -> None:
    await start_worker()
    answer = await _without_max_tokens(await start_api(default_max_tokens=0, max_tokens_limit=9))
    assert answer["usage"]["completion_tokens"] == 9


async def test_an_idle_stream_gets_a_keepalive_comment_at_the_set_interval(
    start_api: StartApi,
) -> None:
    api = await start_api(accept_models="mock", sse_keepalive_seconds=0.2)
    async with api.client() as client:
        rid = await post_request(client, "nobody runs this")  # no worker: the stream stays idle
        started = time.monotonic()
        comments: list[float] = []
        async with asyncio.timeout(10), client.stream("GET", f"/v1/requests/{rid}/events") as r:
            async for line in r.aiter_lines():
                if line.startswith(":"):
                    comments.append(time.monotonic() - started)
                if len(comments) == 3:
                    break
    # Three comments, each an interval after the one before: never much sooner than three
    # intervals; the upper bound (the 15 s default would give none) is only a loaded
    # machine's margin. Single gaps are not bounded: a late comment shortens the next.
    assert 3 * 0.2 * 0.9 <= comments[-1] < 5, comments


class Stubborn:
    """A backend that finishes its step through the first cancel (a blocking call)."""

    def count_tokens(self, text: str) -> int:
        return count_tokens(text)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[str]:
        ignored = False
        for i in range(request.max_tokens):
            try:
                await asyncio.sleep(0.02)
            except asyncio.CancelledError:
                if ignored:
                    raise
                ignored = True
            yield f" t{i}"


async def _ended_at_the_job_timeout(api: RunningApi, redis: Redis) -> tuple[float, str]:
    """Submit a request longer than the worker's job timeout (0.5 or 1 s); check how it ended
    (client, record, lease, metrics); return how long it ran, and its error message."""
    async with api.client() as client:
        await wait_ready(client)
        submitted = time.monotonic()
        rid = await post_request(client, "p", max_tokens=500)  # 10 s at 50 tokens/s
        failed = await wait_status(client, rid, "failed", timeout=5)
        ran = time.monotonic() - submitted
        async with client.stream("GET", f"/v1/requests/{rid}/events") as r:
            events = [json.loads(f.data) async for f in frames(r)]

        async def counted() -> bool:
            text = (await client.get("/metrics")).text
            return value(text, "llmq_requests_total", finished_reason="timeout") == 1

        await wait_until(counted, timeout=5, what="the timeout to be counted")
        text = (await client.get("/metrics")).text
    assert 0 < failed["completion_tokens"] < 500
    assert failed["finish_reason"] == "timeout"
    ends = [e for e in events if e["type"] in ("done", "error")]
    assert len(ends) == 1 and events[-1] is ends[0]
    assert ends[0]["type"] == "error" and ends[0]["finish_reason"] == "timeout"
    assert value(text, "llmq_requests_total") == 1  # counted once, as a timeout
    assert await redis.zscore(keys.running("mock"), rid) is None  # the lease is released
    lease: str | None = await redis.hget(keys.leases("mock"), rid)  # type: ignore[misc]
    assert lease is None
    return ran, str(ends[0]["message"])


async def test_the_job_timeout_ends_a_request_that_runs_longer(
    start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    """The generation stops before the job timeout, and the run ends itself in time.
    A 1 s timeout leaves the run 0.2 s to write its end, which a loaded machine needs."""
    await start_worker(job_timeout_seconds=1.0, model_tokens_per_second=50, max_tries=1)
    ran, message = await _ended_at_the_job_timeout(await start_api(), redis)
    assert ran < 5.0  # the request alone would run 10 s; the rest is a loaded machine's margin
    assert message == "generation stopped before the job timeout of 1 s"


async def test_arqs_job_timeout_ends_a_run_that_did_not_stop_itself(
    start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    """The backstop: the generation goes on past its own stop, arq's timeout cancels
    the run, and the worker still writes the request's end."""
    await start_worker(job_timeout_seconds=0.5, max_tries=1, backend=Stubborn())
    _, message = await _ended_at_the_job_timeout(await start_api(), redis)
    assert message == "the run stopped at the job timeout of 0.5 s"
