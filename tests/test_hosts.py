"""Many hosts: clients, APIs and workers on separate network namespaces, links cut and healed.

One cluster for the module (two API hosts, three worker hosts, a Redis host, a
client host); each test leaves every link up and every process running.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis

from llmq.protocol import keys
from rigs.hosts import Stack
from tests.support.hosts import (
    client,
    cluster_stack,
    expected_text,
    openai_text,
    record,
    wait_api_ready,
)
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.timeout(120), pytest.mark.netns]

WORKER = {
    "model_tokens_per_second": 50,
    "heartbeat_seconds": 0.5,
    "lease_seconds": 3.0,
    "concurrency": 4,
    "drain_seconds": 1,
    "model_mean_tokens": 0,
}
API = {"heartbeat_seconds": 0.5, "orphan_grace_seconds": 2.0}


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    yield from cluster_stack(api=API, worker=WORKER)


@pytest.fixture
async def redis(stack: Stack) -> AsyncIterator[Redis]:
    client = Redis.from_url(stack.cluster.redis_url(), decode_responses=True)
    yield client
    await client.aclose()


async def test_openai_sdk_on_the_client_host_streams_a_request_run_on_a_worker_host(
    stack: Stack,
) -> None:
    body = {"model": "mock", "prompt": "across hosts", "max_tokens": 30, "seed": 7}
    expected = await expected_text(stack, body)
    run = client(stack, "openai", stack.api_url("api1"), json.dumps(body))
    lines = await run.finish(timeout=30)
    assert lines[-1].get("end"), lines
    assert openai_text(lines) == expected
    done = await record(stack, lines[0]["id"])
    assert done["status"] == "done"
    assert stack.worker_host(done["worker"]) in {"worker1", "worker2", "worker3"}


async def test_native_client_resumes_on_api2_with_exactly_the_remaining_events(
    stack: Stack, redis: Redis
) -> None:
    body = {"model": "mock", "prompt": "resume elsewhere", "max_tokens": 100, "seed": 3}
    run = client(
        stack, "native", stack.api_url("api1"), stack.api_url("api2"), json.dumps(body), "1.0"
    )
    try:
        await run.wait(
            lambda ls: sum(x.get("event") == "tokens" for x in ls) >= 5,
            timeout=30,
            what="five token events from api1",
        )
        stack.cluster.cut("api1")
        lines = await run.finish(timeout=40)
    finally:
        stack.cluster.heal("api1")
    assert lines[-1].get("end"), lines
    switch = next(i for i, x in enumerate(lines) if "switch" in x)
    assert switch > 5 and lines[switch]["error"] in (
        "ReadTimeout",
        "ReadError",
        "RemoteProtocolError",
    )
    received = [x for x in lines if "sse_id" in x]
    rid = lines[0]["id"]
    stored = await redis.xrange(keys.stream(rid))
    assert [x["sse_id"] for x in received] == [entry_id for entry_id, _ in stored]
    assert [x["data"] for x in received] == [json.loads(f["data"]) for _, f in stored]
    indices = [
        i
        for x in received
        if x["event"] == "tokens"
        for i in range(x["data"]["index"], x["data"]["index"] + len(x["data"]["tokens"]))
    ]
    assert indices == list(range(100))
    await wait_api_ready(stack, "api1")


async def nothing_running(redis: Redis, timeout: float = 10) -> None:
    async def empty() -> bool:
        return int(await redis.zcard(keys.running("mock"))) == 0

    await wait_until(empty, timeout=timeout, what="the running set to empty")


async def test_partitioned_api_host_its_openai_requests_are_cancelled_by_the_survivor(
    stack: Stack, redis: Redis
) -> None:
    body = {"model": "mock", "prompt": "lost api", "max_tokens": 400, "seed": 5}
    run = client(stack, "openai", stack.api_url("api1"), json.dumps(body))
    try:
        lines = await run.wait(lambda ls: len(ls) >= 5, timeout=30, what="five chunks")
        rid = lines[0]["id"]
        stack.cluster.cut("api1")
        lines = await run.finish(timeout=20)
        assert lines[-1].get("error") == "APITimeoutError", lines[-3:]

        async def cancelled() -> bool:
            return bool((await record(stack, rid))["status"] == "cancelled")

        # grace 2 s after the last beat (0.5 s), then a sweep (0.25 s) and a cancel
        # message; the wait's bound is a loaded machine's margin (without the orphan
        # sweep the request would run its 400 tokens, 8 s)
        await wait_until(cancelled, timeout=15, what="the orphaned request to be cancelled")
        await nothing_running(redis)
        final = await record(stack, rid)
    finally:
        stack.cluster.heal("api1")
    assert final["completion_tokens"] < 400
    await wait_api_ready(stack, "api1")


async def test_a_worker_link_flapping_twice_duplicates_nothing_and_nothing_sticks(
    stack: Stack, redis: Redis
) -> None:
    body = {"model": "mock", "prompt": "flapping", "max_tokens": 200, "seed": 9}
    expected = await expected_text(stack, body)
    run = client(stack, "openai", stack.api_url("api2"), json.dumps(body))
    lines = await run.wait(lambda ls: len(ls) >= 3, timeout=30, what="three chunks")
    rid = lines[0]["id"]
    host = stack.worker_host((await record(stack, rid))["worker"])
    assert host is not None
    try:
        for _ in range(2):  # twice within 10 s: down 0.5 s, up 1.5 s
            stack.cluster.cut(host)
            await asyncio.sleep(0.5)
            stack.cluster.heal(host)
            await asyncio.sleep(1.5)
    finally:
        stack.cluster.heal(host)
    lines = await run.finish(timeout=40)
    assert lines[-1].get("end"), lines[-1]
    assert openai_text(lines) == expected, "tokens lost or repeated"
    final = await record(stack, rid)
    assert final["status"] == "done" and final["completion_tokens"] == 200
    await nothing_running(redis)
