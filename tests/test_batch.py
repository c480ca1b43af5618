"""The Batch API through the unmodified openai SDK: files, batches, their lifecycle and
output, bad input refused with nothing half-made, the completion window honoured."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import io
import json
import logging
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

import openai
import pytest
from redis.asyncio import Redis

from api.batch import batch_run, batch_store
from api.batch.batch_feeder import BatchFeeder
from cli.batch import run_batch
from cli.main import build_parser
from llmq.embedded import EmbeddedRedis
from llmq.protocol import batches, keys, scripts
from llmq.protocol.queue import BATCH_BAND_MS
from llmq.protocol.streams import lifecycle_entries
from llmq.schema import Lifecycle
from llmq.tail import format_line
from tests.support.exposition import value
from tests.support.native import post_request, record, wait_ready, wait_status
from tests.support.processes import llmq
from tests.support.servers import RunningApi, StartApi, StartWorker
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(90)


def chat_line(custom_id: str, content: str, max_tokens: int = 6, **body: Any) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "mock",
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
            "seed": 7,
            **body,
        },
    }


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


async def finished(client: openai.AsyncOpenAI, batch_id: str, timeout: float = 60) -> Any:
    seen: list[Any] = []

    async def ended() -> bool:
        seen.append(await client.batches.retrieve(batch_id))
        return seen[-1].status in ("completed", "failed", "expired", "cancelled")

    await wait_until(ended, timeout=timeout, what=f"batch {batch_id} to end", interval=0.05)
    return seen


async def create(client: openai.AsyncOpenAI, lines: list[dict[str, Any]]) -> Any:
    """Upload ``lines`` and create a chat completions batch of them (24h window)."""
    uploaded = await client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    return await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )


def by_custom_id(text: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for raw in text.splitlines():
        line = json.loads(raw)
        assert line["custom_id"] not in out, "a custom_id twice in the output"
        out[line["custom_id"]] = line
    return out


async def test_a_batch_runs_through_the_sdk_and_each_line_equals_the_request_alone(
    stack: RunningApi, redis: Redis
) -> None:
    lines = [chat_line(f"line-{i}", f"question number {i}", max_tokens=5 + i) for i in range(12)]
    async with stack.sdk() as client:
        uploaded = await client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
        assert uploaded.purpose == "batch" and uploaded.bytes == len(jsonl(lines))
        assert (await client.files.retrieve(uploaded.id)).filename == "in.jsonl"
        assert [f.id async for f in client.files.list()] == [uploaded.id]
        batch = await client.batches.create(
            input_file_id=uploaded.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            metadata={"job": "nightly"},
        )
        assert batch.status == "in_progress"
        assert batch.request_counts is not None and batch.request_counts.total == 12
        seen = await finished(client, batch.id)
        done = seen[-1]
        alone = await client.chat.completions.create(**lines[3]["body"])
        listed = [b.id async for b in client.batches.list()]
        output = (await client.files.content(done.output_file_id)).text
    assert done.status == "completed", done
    assert done.metadata == {"job": "nightly"}
    assert done.request_counts.completed == 12 and done.request_counts.failed == 0
    assert done.error_file_id is None
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    counts = [s.request_counts.completed for s in seen]
    assert counts == sorted(counts)
    assert listed == [batch.id]
    results = by_custom_id(output)
    assert sorted(results) == sorted(line["custom_id"] for line in lines)
    answer = results["line-3"]["response"]
    assert answer["status_code"] == 200
    assert answer["body"]["choices"][0]["message"] == alone.choices[0].message.model_dump(
        exclude_none=True
    )
    assert answer["body"]["usage"]["completion_tokens"] == 8
    # nothing of the batch waits in the queue or runs once it ended
    assert not await redis.exists(keys.batch_running(batch.id))
    assert await redis.zcard(keys.BATCHES_ACTIVE) == 0
    # it keeps only what its owner fetches: the batch and its files (its copied lines
    # and results go), and a late result (a collector that did not stop) is not taken
    own = {keys.batch(batch.id)}

    async def only_its_record() -> bool:
        return {k async for k in redis.scan_iter(f"*{batch.id}*")} == own

    await wait_until(only_its_record, timeout=5, what="the ended batch's lines and results to go")
    assert not await batches.record(redis, batch.id, "line-0", '{"late": 1}', ok=True)
    assert {k async for k in redis.scan_iter(f"*{batch.id}*")} == own
    for file_id in (uploaded.id, done.output_file_id):
        assert await redis.exists(keys.file(file_id))


async def test_batch_lines_run_in_a_band_below_every_interactive_priority(
    start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    """With the only slot busy, batch lines wait in the queue (the lookahead, no more)
    behind an interactive request that arrived after them at the least urgent
    priority, which then runs first; they do not count toward the queue's bound."""
    await start_worker(model_tokens_per_second=100.0, concurrency=1)
    api = await start_api(batch_lookahead=2, max_queue_depth=1)
    async with api.client() as http, api.sdk() as client:
        await wait_ready(http)
        blocker = await post_request(http, "blocker", max_tokens=150)
        await wait_status(http, blocker, "running")
        lines = [chat_line(f"l{i}", f"q {i}") for i in range(5)]
        batch = await create(client, lines)

        async def lookahead_queued() -> bool:
            return int(await redis.zcard(keys.queue("mock"))) == 2

        await wait_until(lookahead_queued, timeout=10, what="the lookahead of batch lines")
        late = await post_request(http, "late", max_tokens=2, priority=1000)
        order = await redis.zrange(keys.queue("mock"), 0, -1)
        assert order[0] == late and len(order) == 3, order
        assert await redis.zcard(keys.queue("mock")) == 3  # the batch's other lines wait
        done = (await finished(client, batch.id))[-1]
        late_record = await record(http, late)
        output = by_custom_id((await client.files.content(done.output_file_id)).text)
        started = [
            (await record(http, line["response"]["request_id"]))["started_at"]
            for line in output.values()
        ]
    assert done.status == "completed"
    assert late_record["started_at"] < min(started)


@pytest.mark.parametrize(
    ("content", "code"),
    [
        (b"{not json\n", "invalid_json_line"),
        (jsonl([{**chat_line("a", "x"), "url": "/v1/completions"}]), "mismatched_url"),
        (jsonl([chat_line("a", "x"), chat_line("a", "y")]), "duplicate_custom_id"),
        (jsonl([chat_line("a", "x", max_tokens=0)]), "invalid_request"),
        (jsonl([chat_line("a", "x"), chat_line("b", "y", stream=True)]), "invalid_request"),
    ],
)
async def test_a_bad_line_fails_the_batch_with_its_line_and_makes_nothing(
    stack: RunningApi, redis: Redis, content: bytes, code: str
) -> None:
    async with stack.sdk() as client:
        uploaded = await client.files.create(file=("bad.jsonl", content), purpose="batch")
        batch = await client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
    assert batch.status == "failed" and batch.failed_at
    assert batch.errors is not None and batch.errors.data
    assert batch.errors.data[0].code == code
    assert batch.errors.data[0].line is not None
    assert not await redis.exists(keys.batch_lines(batch.id))
    assert await redis.zcard(keys.BATCHES_ACTIVE) == 0
    assert await redis.zcard(keys.queue("mock")) == 0


async def test_files_over_the_bounds_are_refused_clearly_and_not_stored(
    start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    await start_worker()
    api = await start_api(batch_max_file_bytes=2048, batch_max_lines=3)
    async with api.sdk() as client:
        with pytest.raises(openai.BadRequestError) as too_many:
            await client.files.create(
                file=("in.jsonl", jsonl([chat_line(str(i), "x") for i in range(4)])),
                purpose="batch",
            )
        with pytest.raises(openai.BadRequestError) as too_big:
            await client.files.create(file=("in.jsonl", b"x" * 3000), purpose="batch")
        with pytest.raises(openai.BadRequestError) as purpose:
            await client.files.create(file=("in.jsonl", b"{}"), purpose="fine-tune")
        assert [f async for f in client.files.list()] == []
    assert too_many.value.code == "too_many_lines"
    assert too_big.value.code == "file_too_large"
    assert purpose.value.param == "purpose"
    assert [k async for k in redis.scan_iter(keys.file("*"))] == []


async def test_a_changed_batch_bound_takes_effect_live_without_a_restart(
    redis_url: str, start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    """Batch bounds are pool policy: ``llmq config set`` reaches a running API process
    within a second (docs/policy.md), the upload's body bound included."""
    await start_worker()
    api = await start_api(batch_max_file_bytes=2048, batch_max_lines=3)
    four = jsonl([chat_line(str(i), "x") for i in range(4)])
    big = jsonl([chat_line(str(i), "x" * 1000) for i in range(3)])
    async with api.sdk() as client:
        with pytest.raises(openai.BadRequestError):
            await client.files.create(file=("in.jsonl", four), purpose="batch")
        code, _, err = await llmq(
            redis_url, "config", "set", "batch_max_lines=4", "batch_max_file_bytes=1048576"
        )
        assert code == 0, err

        async def accepted(content: bytes) -> bool:
            try:
                await client.files.create(file=("in.jsonl", content), purpose="batch")
            except openai.BadRequestError:
                return False
            return True

        await wait_until(lambda: accepted(four), timeout=2, what="the line bound to follow")
        assert await accepted(big)
    assert len([k async for k in redis.scan_iter(keys.file("*"))]) >= 2


async def test_files_and_batches_are_visible_only_to_the_key_that_made_them(
    start_api: StartApi, start_worker: StartWorker
) -> None:
    await start_worker()
    api = await start_api(api_keys="k1,k2")
    async with api.sdk("k1") as one, api.sdk("k2") as two:
        uploaded = await one.files.create(
            file=("in.jsonl", jsonl([chat_line("a", "x")])), purpose="batch"
        )
        batch = await one.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        with pytest.raises(openai.NotFoundError):
            await two.files.retrieve(uploaded.id)
        with pytest.raises(openai.NotFoundError):
            await two.batches.retrieve(batch.id)
        with pytest.raises(openai.NotFoundError):
            await two.batches.create(
                input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
        assert [b async for b in two.batches.list()] == []
        assert [f async for f in two.files.list()] == []
        await finished(one, batch.id)


async def test_a_batch_past_its_window_expires_with_its_partial_output(
    start_api: StartApi, start_worker: StartWorker
) -> None:
    """One slot, lines of 200 tokens at 100 tokens/s, a 3 s window: some lines finish,
    the one running is cancelled, the rest never run; all are accounted for."""
    await start_worker(model_tokens_per_second=100.0, concurrency=1)
    api = await start_api(batch_lookahead=0)
    lines = [chat_line(f"l{i}", f"slow {i}", max_tokens=120) for i in range(8)]
    async with api.sdk() as client:
        uploaded = await client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
        batch = await client.batches.create(
            input_file_id=uploaded.id,
            endpoint="/v1/chat/completions",
            completion_window="3s",  # type: ignore[arg-type]
        )
        done = (await finished(client, batch.id))[-1]
        output = (
            by_custom_id((await client.files.content(done.output_file_id)).text)
            if done.output_file_id
            else {}
        )
        errors = by_custom_id((await client.files.content(done.error_file_id)).text)
    assert done.status == "expired" and done.expired_at and done.finalizing_at
    for line in output.values():  # what the window stopped is not an answer
        assert line["response"]["body"]["choices"][0]["finish_reason"] == "length"
    assert 1 <= len(output) < 8
    assert len(output) + len(errors) == 8
    assert {e["error"]["code"] for e in errors.values()} == {"batch_expired"}
    assert done.request_counts.completed == len(output)
    assert done.request_counts.failed == len(errors)


async def test_cancel_stops_the_lines_in_flight_and_keeps_the_finished_ones(
    start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    await start_worker(model_tokens_per_second=100.0, concurrency=2)
    api = await start_api(batch_lookahead=0)
    lines = [chat_line(f"l{i}", f"slow {i}", max_tokens=60) for i in range(10)]
    async with api.sdk() as client:
        batch = await create(client, lines)

        async def some_done() -> bool:
            got = await client.batches.retrieve(batch.id)
            return got.request_counts is not None and got.request_counts.completed >= 2

        await wait_until(some_done, timeout=30, what="two lines to finish")
        cancelling = await client.batches.cancel(batch.id)
        done = (await finished(client, batch.id))[-1]
        output = by_custom_id((await client.files.content(done.output_file_id)).text)
        errors = by_custom_id((await client.files.content(done.error_file_id)).text)
    assert cancelling.status in ("cancelling", "cancelled")
    assert done.status == "cancelled" and done.cancelled_at and done.cancelling_at
    for line in output.values():
        assert line["response"]["body"]["choices"][0]["finish_reason"] == "length"
    assert len(output) >= 2 and len(output) + len(errors) == 10
    assert {e["error"]["code"] for e in errors.values()} == {"batch_cancelled"}
    assert await redis.zcard(keys.queue("mock")) == 0
    assert await redis.zcard(keys.running("mock")) == 0


async def test_a_line_result_is_recorded_once_whoever_collects_it_again(redis: Redis) -> None:
    """A second result of a custom_id (a feeder that took over collects the line
    again) changes neither the output nor the counts, even as an error."""
    first = await batches.record(redis, "b1", "line-1", '{"first": 1}', ok=True)
    again = await batches.record(redis, "b1", "line-1", '{"second": 2}', ok=True)
    as_error = await batches.record(redis, "b1", "line-1", '{"error": 3}', ok=False)
    assert (first, again, as_error) == (True, False, False)
    assert await redis.hgetall(keys.batch_output("b1")) == {"line-1": '{"first": 1}'}  # type: ignore[misc]
    assert not await redis.exists(keys.batch_errors("b1"))
    assert await redis.hget(keys.batch("b1"), "completed") == "1"  # type: ignore[misc]
    assert await redis.hget(keys.batch("b1"), "failed") is None  # type: ignore[misc]


async def test_a_collection_that_loses_redis_is_logged_once_and_leaves_no_task_exception(
    stack: RunningApi, redis: Redis, own_redis: EmbeddedRedis, caplog: pytest.LogCaptureFixture
) -> None:
    """A line's answer is read from its stream, then its feeder's Redis is gone (killed)
    when the collection checks and records it: the connection error is logged once, in
    one line, and the task's exception is retrieved: the event loop reports no "Task
    exception was never retrieved" once the task is collected."""
    state = stack.app_state()
    batch = batch_store.new_batch(
        endpoint="/v1/chat/completions",
        input_file_id="file-none",
        completion_window="24h",
        window_seconds=3600,
        metadata=None,
        owner=None,
    ).model_copy(update={"model": "mock"})
    body = chat_line("only", "lost redis")["body"]
    subs = await batch_run.submit_line(state, batch, body)

    async def answered() -> bool:
        status = await redis.hget(keys.request(subs[0].id), "status")  # type: ignore[misc]
        return bool(status == "done")

    await wait_until(answered, timeout=10, what="the line's request to finish")
    lost = Redis.from_url(own_redis.url, decode_responses=True)
    await lost.ping()
    own_redis.kill()
    # the answer is read through the live relay, the rest from the Redis that is gone
    feeder = BatchFeeder(dataclasses.replace(state, redis=lost))
    loop = asyncio.get_running_loop()
    reported: list[str] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: reported.append(str(context["message"])))
    try:
        with caplog.at_level(logging.WARNING, logger="api.batch.batch_feeder"):
            entry = {"line": {"custom_id": "only", "body": body}, "subs": [asdict(subs[0])]}
            feeder.collect(batch, "only", entry)
            task = feeder.collecting[(batch.id, "only")]
            await asyncio.wait([task])  # its own done callback ran first, added first
            del feeder, task
            gc.collect()
    finally:
        loop.set_exception_handler(previous)
        await lost.aclose()
    assert not [m for m in reported if "never retrieved" in m], reported
    logged = [r for r in caplog.records if "collecting line only failed" in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is None, logged
    assert "Error" in logged[0].getMessage()  # the connection error, named


@pytest.mark.slow
async def test_a_live_request_takes_the_slot_of_a_long_batch_line_which_resumes_exactly(
    start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    """One slot, running a batch line of 600 tokens at 100 tokens/s: a live request
    that arrives meanwhile finishes before the line, which yields its slot at a token
    and resumes from where it stopped, its output equal to the request run alone."""
    await start_worker(model_tokens_per_second=100.0, concurrency=1)
    api = await start_api(batch_lookahead=0)
    line = chat_line("long", "a long line", max_tokens=600)
    async with api.client() as http, api.sdk() as client:
        await wait_ready(http)
        batch = await create(client, [line])

        async def line_running() -> bool:
            return int(await redis.zcard(keys.running("mock"))) == 1

        await wait_until(line_running, timeout=10, what="the batch line to run")
        live = await post_request(http, "live", max_tokens=3)
        live_done = await wait_status(http, live, "done", timeout=60)
        done = (await finished(client, batch.id))[-1]
        output = by_custom_id((await client.files.content(done.output_file_id)).text)
        rid = output["long"]["response"]["request_id"]
        line_record = await record(http, rid)
        alone = await client.chat.completions.create(**line["body"])
    assert live_done["finished_at"] < line_record["finished_at"]
    assert line_record["attempts"] == 2, "the line did not yield"
    body = output["long"]["response"]["body"]
    assert body["choices"][0]["message"]["content"] == alone.choices[0].message.content
    assert body["usage"]["completion_tokens"] == 600


def test_the_scripts_batch_band_is_the_protocols() -> None:
    band = re.search(r"local BATCH_BAND_MS = '(\d+)'", scripts.source("enqueue"))
    assert band is not None and int(band[1]) == BATCH_BAND_MS


@pytest.mark.parametrize(
    ("endpoint", "body", "alone"),
    [
        (
            "/v1/completions",
            {"model": "mock", "prompt": ["one two", "three"], "n": 2, "max_tokens": 4, "seed": 5},
            "completions",
        ),
        ("/v1/embeddings", {"model": "mock", "input": ["a text", "another"]}, "embeddings"),
        (
            "/v1/responses",
            {"model": "mock", "input": "hello there", "max_output_tokens": 5, "seed": 2},
            "responses",
        ),
    ],
)
async def test_each_endpoint_answers_a_line_as_its_live_route_does(
    stack: RunningApi, endpoint: str, body: dict[str, Any], alone: str
) -> None:
    line = {"custom_id": "only", "method": "POST", "url": endpoint, "body": body}
    async with stack.sdk() as client:
        uploaded = await client.files.create(file=("in.jsonl", jsonl([line])), purpose="batch")
        batch = await client.batches.create(
            input_file_id=uploaded.id,
            endpoint=endpoint,  # type: ignore[arg-type]
            completion_window="24h",
        )
        done = (await finished(client, batch.id))[-1]
        output = by_custom_id((await client.files.content(done.output_file_id)).text)
        extra = {k: body[k] for k in ("seed",) if alone == "responses"}
        known = {k: v for k, v in body.items() if k not in extra}
        live = await getattr(client, alone).create(**known, extra_body=extra or None)
    got = output["only"]["response"]
    assert got["status_code"] == 200
    if alone == "responses":  # its ids are the request's
        assert got["body"]["output"][0]["content"][0]["text"] == live.output_text
        assert got["body"]["usage"]["output_tokens"] == live.usage.output_tokens == 5
        return
    answer = type(live).model_validate(got["body"])
    volatile = {"id", "created"}
    assert answer.model_dump(exclude=volatile) == live.model_dump(exclude=volatile)


async def test_an_embeddings_lines_vectors_stay_for_a_feeder_that_collects_it_again(
    stack: RunningApi, redis: Redis
) -> None:
    """A live embeddings request's vectors leave its stream once read; a batch line's
    stay, so that a feeder taking over from one that died before recording the line
    reads the same answer, not an error."""
    body = {"model": "mock", "input": ["one", "two"]}
    line = {"custom_id": "e", "method": "POST", "url": "/v1/embeddings", "body": body}
    async with stack.sdk() as client:
        uploaded = await client.files.create(file=("in.jsonl", jsonl([line])), purpose="batch")
        batch = await client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
        )
        done = (await finished(client, batch.id))[-1]
        output = by_custom_id((await client.files.content(done.output_file_id)).text)
    rid = output["e"]["response"]["request_id"]
    kinds = [
        fields.get(b"type", fields.get("type"))
        for _, fields in await redis.xrange(keys.stream(rid))
    ]
    assert kinds.count(b"embedding") + kinds.count("embedding") >= 1, kinds


async def test_batch_counters_are_in_the_metrics(stack: RunningApi) -> None:
    lines = [chat_line(f"l{i}", f"q {i}") for i in range(3)]
    async with stack.sdk() as client:
        batch = await create(client, lines)
        await finished(client, batch.id)
    async with stack.client() as http:

        async def counted() -> bool:
            text = (await http.get("/metrics")).text
            return (
                'llmq_batch_lines_total{model="mock",outcome="completed"} 3.0' in text
                and 'llmq_batches_total{model="mock",status="completed"} 1.0' in text
            )

        await wait_until(counted, timeout=10, what="the batch counters")


async def test_a_batch_is_active_in_the_metrics_until_it_ends(start_api: StartApi) -> None:
    """``llmq_batches_active`` counts a batch from its creation to its end: what the
    stalled-batch alert compares with the lines' progress."""
    api = await start_api(accept_models="ghost")  # no worker: its line never runs
    line = chat_line("g", "waits")
    line["body"]["model"] = "ghost"
    async with api.sdk() as client, api.client() as http:
        batch = await create(client, [line])
        assert value((await http.get("/metrics")).text, "llmq_batches_active") == 1
        await client.batches.cancel(batch.id)
        assert (await finished(client, batch.id))[-1].status == "cancelled"
        assert value((await http.get("/metrics")).text, "llmq_batches_active") == 0


async def test_a_batch_s_progress_is_in_the_lifecycle_stream(
    stack: RunningApi, redis: Redis
) -> None:
    lines = [chat_line(f"l{i}", f"q {i}") for i in range(3)]
    async with stack.sdk() as client:
        batch = await create(client, lines)
        await finished(client, batch.id)
    notes = [
        Lifecycle.model_validate_json(fields["data"])
        for _, fields in await lifecycle_entries(redis)
        if fields["event"] == "batch"
    ]
    assert {n.request_id for n in notes} == {batch.id}
    assert notes[-1].status == "completed" and notes[-1].completed == 3 and notes[-1].total == 3
    done = [n.completed or 0 for n in notes]
    assert done == sorted(done)
    assert "status=completed completed=3 failed=0 total=3" in format_line(notes[-1])


async def test_llmq_batch_submits_a_file_shows_progress_and_writes_the_output(
    stack: RunningApi, tmp_path: Path
) -> None:
    lines = [chat_line(f"l{i}", f"q {i}") for i in range(4)]
    lines.append({**chat_line("bad", "x"), "body": {"model": "mock", "messages": [], "n": 0}})
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl(lines[:4]))
    out = tmp_path / "out.jsonl"
    err = io.StringIO()
    flags = ["--endpoint", "/v1/chat/completions", "-o", str(out), "--url", stack.url]
    args = build_parser().parse_args(["batch", str(source), *flags, "--poll-seconds", "0.05"])
    assert await run_batch(args, err) == 0
    assert sorted(by_custom_id(out.read_text())) == ["l0", "l1", "l2", "l3"]
    assert f"[{'#' * 30}] 4/4 completed" in err.getvalue()
    source.write_bytes(jsonl(lines))
    assert await run_batch(args, err) == 2
    assert "line 5: invalid_request" in err.getvalue()


async def test_runs_past_max_tries_fail_unless_they_were_yields(
    start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    """A yield is a run that is no failure: a request whose next run is its fourth
    fails with max_tries 3, unless one of the runs before was a batch line's yield."""
    api = await start_api(accept_models="mock")
    async with api.client() as http:
        plain = await post_request(http, "plain", max_tokens=3)
        yielded = await post_request(http, "yielded", max_tokens=3)
        for rid in (plain, yielded):
            await redis.set(keys.retry(rid, "mock"), 3)
        await batches.note_yield(redis, yielded)
        await start_worker(max_tries=3)
        failed = await wait_status(http, plain, "failed", timeout=20)
        done = await wait_status(http, yielded, "done", timeout=20)
    assert failed["error"] == "the request could not be run"
    assert done["completion_tokens"] == 3
