"""A partitioned worker: its link is cut mid-stream with its processes left running.

Its lease expires, the request re-runs on another host and the client's text is
that of an undisturbed run. The cut-off worker stops generating on its own when
the lease would expire by its clock (``lease_self_expiry``), while still cut off:
it spends at most about a lease's worth of tokens nobody reads. When the link
heals, nothing it wrote afterwards reaches the request's stream, record, metrics
or lifecycle.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from llmq.protocol import keys
from rigs.hosts import Stack
from tests.support.hosts import client, cluster_stack, expected_text, openai_text, record
from tests.support.sse import frames
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.timeout(120), pytest.mark.netns]

WORKER = {
    "model_tokens_per_second": 50,
    "heartbeat_seconds": 0.5,
    "lease_seconds": 2.0,
    "concurrency": 4,
    "drain_seconds": 1,
    "model_mean_tokens": 0,
}
TOKENS = 300
RATE = WORKER["model_tokens_per_second"]


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    yield from cluster_stack(worker=WORKER)


@pytest.fixture
async def redis(stack: Stack) -> AsyncIterator[Redis]:
    client = Redis.from_url(stack.cluster.redis_url(), decode_responses=True)
    yield client
    await client.aclose()


async def outcomes(stack: Stack) -> float:
    """Requests counted by outcome (every finished_reason), cluster-wide."""
    async with httpx.AsyncClient(timeout=5) as http:
        text = (await http.get(stack.api_url("api2") + "/metrics")).text
    found = re.findall(r'^llmq_requests_total\{[^}]*model="mock"[^}]*\} (\S+)$', text, re.M)
    return sum(float(x) for x in found)


async def running_on(stack: Stack, host: str) -> int:
    async with httpx.AsyncClient(timeout=5) as http:
        workers = (await http.get(stack.api_url("api2") + "/v1/workers")).json()["data"]
    for worker in workers:
        if stack.worker_host(worker["id"]) == host:
            return int(worker["running"])
    return -1


async def native_replay(stack: Stack, rid: str) -> list[dict[str, Any]]:
    async with (
        httpx.AsyncClient(timeout=10) as http,
        http.stream("GET", f"{stack.api_url('api2')}/v1/requests/{rid}/events") as response,
    ):
        events = []
        async for frame in frames(response):
            events.append({"type": frame.event, **frame.json()})
            if frame.event in ("done", "error"):
                break
    return events


async def stored(redis: Redis, rid: str) -> list[dict[str, Any]]:
    return [json.loads(f["data"]) for _, f in await redis.xrange(keys.stream(rid))]


def stopped_at(log: str, rid: str) -> int | None:
    """How many tokens the worker had produced when it stopped ``rid`` by its own clock."""
    pattern = (
        rf"request {rid}: its lease would have expired by this worker's clock.*at (\d+) tokens"
    )
    found = re.search(pattern, log)
    return int(found.group(1)) if found else None


def token_indices(events: list[dict[str, Any]]) -> list[int]:
    return [
        i
        for e in events
        if e["type"] == "tokens"
        for i in range(e["index"], e["index"] + len(e["tokens"]))
    ]


async def test_a_partitioned_worker_is_replaced_then_fenced_when_its_link_heals(
    stack: Stack, redis: Redis
) -> None:
    body = {"model": "mock", "prompt": "partition", "max_tokens": TOKENS, "seed": 21}
    undisturbed_before = await outcomes(stack)
    expected = await expected_text(stack, body)

    async def undisturbed_counted() -> bool:
        return await outcomes(stack) >= undisturbed_before + 1

    # the undisturbed run's finish reaches /metrics with the next flush (1 s)
    await wait_until(undisturbed_counted, timeout=5, what="the undisturbed run to be counted")
    counted_before = undisturbed_before + 1
    run = client(stack, "openai", stack.api_url("api1"), json.dumps(body))
    lines = await run.wait(lambda ls: len(ls) >= 10, timeout=30, what="ten chunks")
    rid = lines[0]["id"]
    old = stack.worker_host((await record(stack, rid))["worker"])
    assert old is not None
    at_cut = len(token_indices(await stored(redis, rid)))
    stack.cluster.cut(old)
    try:

        async def rerun_elsewhere() -> bool:
            found = await record(stack, rid)
            return found["attempts"] == 2 and stack.worker_host(found["worker"]) != old

        await wait_until(rerun_elsewhere, timeout=15, what="the lease to expire and a re-run")

        def stopped_while_cut() -> bool:
            return stopped_at(stack.workers[old].output(), rid) is not None

        # still cut off, nothing from Redis: it stops by its own clock
        await wait_until(stopped_while_cut, timeout=10, what="the cut-off worker to stop itself")
    finally:
        stack.cluster.heal(old)
    produced = stopped_at(stack.workers[old].output(), rid)
    assert produced is not None
    # it generated about a lease's worth after the cut, not the rest of the request
    bound = RATE * (WORKER["lease_seconds"] + WORKER["heartbeat_seconds"]) + 25
    assert produced - at_cut <= bound, (produced, at_cut)

    async def old_stopped() -> bool:
        # it stops its attempt (and reports running 0), or stops altogether
        return not stack.workers[old].running() or await running_on(stack, old) == 0

    await wait_until(old_stopped, timeout=15, what="the fenced worker to stop its attempt")
    lines = await run.finish(timeout=30)
    assert lines[-1].get("end"), lines[-1]
    assert openai_text(lines) == expected, "tokens lost or repeated at the client"

    final = await record(stack, rid)
    assert final["status"] == "done" and final["attempts"] == 2
    assert final["completion_tokens"] == TOKENS
    assert stack.worker_host(final["worker"]) != old
    # the stream holds each index once: the old attempt's writes after the reap never landed
    events = await stored(redis, rid)
    assert sorted(token_indices(events)) == list(range(TOKENS))
    assert [e["attempt"] for e in events if e["type"] == "started"] == [1, 2]
    assert [e["type"] for e in events].count("done") == 1 and events[-1]["type"] == "done"
    replay = await native_replay(stack, rid)
    assert token_indices(replay) == list(range(TOKENS)), "duplicate or out-of-order index"
    lifecycle = [
        f for _, f in await redis.xrange(keys.lifecycle(rid)) if f.get("request_id") == rid
    ]
    assert [f["event"] for f in lifecycle].count("finished") == 1
    assert [f["event"] for f in lifecycle].count("started") == 2
    # metrics are flushed once a second: wait for the one outcome, then check nothing more came

    async def counted() -> bool:
        return await outcomes(stack) >= counted_before + 1

    await wait_until(counted, timeout=5, what="the finish to be counted")
    # an absence cannot be polled for: give the old worker's metrics flush (1 s) its chance
    await asyncio.sleep(1.5)
    assert await outcomes(stack) == counted_before + 1, "the fenced attempt was counted"
