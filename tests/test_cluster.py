"""The API and workers, unchanged, on a single Redis and on a real Redis Cluster.

Every test here runs twice (:data:`tests.support.cluster.BOTH_BACKENDS`): against
one ``redis-server``, and against a local cluster of three primaries with a replica
each, chosen by the ``redis+cluster://`` URL alone. A request's stream and record live on the
shard of its group, its model's queue on another, the registry on a third: the
pipeline, priority order, a worker SIGKILLed mid-stream and the resume of its
request all have to work across them.
"""

from __future__ import annotations

import signal
from typing import cast

import pytest
from redis.asyncio import Redis, RedisCluster
from redis.crc import key_slot

from api.summary import window_rates
from llmq import metrics
from llmq.protocol import keys
from tests.support.cluster import BOTH_BACKENDS
from tests.support.exposition import value
from tests.support.native import post_request, record, wait_ready, wait_status
from tests.support.processes import Proc, clean_env
from tests.support.runs import undisturbed
from tests.support.servers import SpawnWorkers, StartApi, StartWorker
from tests.support.sse import frames, openai_chunks
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(90)


@BOTH_BACKENDS
async def test_the_pipeline(
    backend: str, start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    await start_worker(concurrency=2)
    api = await start_api()
    body = {
        "model": "mock",
        "prompt": "say something",
        "max_tokens": 12,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with api.client() as client:
        await wait_ready(client)
        async with client.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            chunks = await openai_chunks(r)
        # the native API: a request, its events read back, another cancelled running
        rid = await post_request(client, "a b c", max_tokens=6)
        async with client.stream("GET", f"/v1/requests/{rid}/events") as r:
            kinds = [f.event async for f in frames(r)]
        long = await post_request(client, "long", max_tokens=400)
        await wait_status(client, long, "running")
        assert (await client.delete(f"/v1/requests/{long}")).status_code == 200
        cancelled = await wait_status(client, long, "cancelled", timeout=10)
        done = await record(client, rid)

        # every process's metrics reach Redis (flushed each second) and /metrics
        async def outcomes() -> tuple[float, float]:
            text = (await client.get("/metrics")).text
            return (
                value(text, "llmq_requests_total", finished_reason="length"),
                value(text, "llmq_requests_total", finished_reason="cancelled"),
            )

        async def counted() -> bool:
            return await outcomes() == (2, 1)

        await wait_until(counted, timeout=10, what="the three requests in /metrics")
    rates = await window_rates(redis)
    assert chunks[-1]["usage"]["completion_tokens"] == 12
    assert kinds[0] == "started" and kinds[-1] == "done" and kinds.count("done") == 1
    assert done["status"] == "done" and done["completion_tokens"] == 6
    assert cancelled["finish_reason"] == "cancelled"
    assert await redis.ttl(keys.stream(rid)) > 0
    assert rates[metrics.GENERATION_TOKENS.name] > 0, "per-second totals, for recent rates"
    if backend == "cluster":  # the request and its model's queue are on different slots
        assert key_slot(keys.stream(rid).encode()) != key_slot(keys.queue("mock").encode())


@BOTH_BACKENDS
async def test_a_higher_priority_overtakes_the_backlog(
    start_api: StartApi, spawn_workers: SpawnWorkers
) -> None:
    await spawn_workers(1, concurrency=1, model_tokens_per_second=100)
    api = await start_api()
    async with api.client() as client:
        busy = await post_request(client, "busy", max_tokens=3000)  # until cancelled
        await wait_status(client, busy, "running")
        backlog = [
            await post_request(client, f"low{i}", priority=5, max_tokens=10) for i in range(3)
        ]
        urgent = await post_request(client, "urgent", priority=0, max_tokens=10)
        assert (await client.delete(f"/v1/requests/{busy}")).status_code == 200  # a slot frees
        records = {rid: await wait_status(client, rid, "done") for rid in [*backlog, urgent]}
    order = sorted(records, key=lambda rid: records[rid]["started_at"])
    assert order == [urgent, *backlog]


@BOTH_BACKENDS
@pytest.mark.slow
async def test_a_killed_workers_request_is_reaped_and_resumed(
    start_api: StartApi, spawn_workers: SpawnWorkers
) -> None:
    max_tokens, seed = 80, 5
    procs = await spawn_workers(2, concurrency=1, model_tokens_per_second=60, lease_seconds=1)
    api = await start_api()
    body = {"model": "mock", "prompt": "resume", "max_tokens": max_tokens, "seed": seed}
    text, rid, victim = "", "", ""
    async with api.client() as client:
        async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            async for frame in frames(r):
                if frame.data == "[DONE]":
                    break
                chunk = frame.json()
                assert "error" not in chunk, chunk
                rid = chunk["id"].split("-", 1)[1]
                text += "".join(c.get("text") or "" for c in chunk["choices"])
                if not victim and len(text.split()) >= 20:
                    victim = (await record(client, rid))["worker"]
                    next(p for p in procs if f"-{p.pid}-" in victim).signal(signal.SIGKILL)
        final = await record(client, rid)
    assert victim, "the worker was never killed"
    assert text == "".join(await undisturbed(max_tokens, seed)), "tokens lost or repeated"
    assert final["attempts"] == 2 and final["worker"] != victim
    assert final["completion_tokens"] == max_tokens


@BOTH_BACKENDS
async def test_llmq_tail_reads_every_lifecycle_stream(
    start_api: StartApi, start_worker: StartWorker, redis_url: str
) -> None:
    """The lifecycle is 64 streams, spread over the shards: ``llmq tail`` reads them
    all (one blocking read on a single Redis, polling per stream on a cluster)."""
    await start_worker()
    api = await start_api()
    async with api.client() as client:
        await wait_ready(client)
        rids = [await post_request(client, f"watched {i}", max_tokens=3) for i in range(3)]
        for rid in rids:
            await wait_status(client, rid, "done")
    tail = Proc(["tail", "--from-start", "--redis-url", redis_url], clean_env())
    try:

        def lines() -> list[list[str]]:
            return [line.split() for line in tail.output().splitlines()]

        await wait_until(lambda: len(lines()) >= 12, timeout=20, what="twelve lines")
    finally:
        tail.stop()
    for rid in rids:
        events = [words[1] for words in lines() if len(words) > 2 and words[2] == rid]
        assert events == ["queued", "started", "first_token", "finished"]


@pytest.mark.parametrize("backend", ["cluster"], indirect=True)
async def test_an_exhausted_cluster_pool_answers_429_not_503(
    backend: str, start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    """The cluster client does not wait for a connection: a node whose connections are
    all busy fails at once (``MaxConnectionsError``). That is overload, answered as
    the plain pool's exhaustion is (429 ``server_busy``), never as an outage."""
    await start_worker()
    api = await start_api(redis_max_connections=1)
    body = {"model": "mock", "prompt": "x", "max_tokens": 2}
    async with api.client() as client:
        await wait_ready(client)
        cluster = cast(RedisCluster, api.app_state().redis)
        held = []
        for node in cluster.get_nodes():  # take every connection every node may open
            while len(node._connections) < node.max_connections or node._free:
                held.append((node, node.acquire_connection()))
        try:
            busy = await client.post("/v1/completions", json=body)
        finally:
            for node, connection in held:
                node._free.append(connection)
        served = await client.post("/v1/completions", json=body)
    assert busy.status_code == 429, busy.text
    assert busy.headers["retry-after"] == "1"
    assert busy.json()["error"]["code"] == "server_busy"
    assert await redis.zcard(keys.queue("mock")) == 0
    assert served.status_code == 200 and served.json()["usage"]["completion_tokens"] == 2


@BOTH_BACKENDS
async def test_each_backend_is_the_one_every_part_uses(
    backend: str, start_api: StartApi, redis: Redis
) -> None:
    """A test parametrized with BOTH_BACKENDS runs its llmq parts on that Redis: the
    cluster variant of a test is not the single one run twice."""
    api = await start_api()
    assert isinstance(api.app_state().redis, RedisCluster) == (backend == "cluster")
    assert isinstance(redis, RedisCluster) == (backend == "cluster")
