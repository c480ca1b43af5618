"""Cluster-wide metrics: aggregation, flushing, exposition, and survival of a killed worker."""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis
from redis.exceptions import TimeoutError as RedisTimeoutError

from api.exposition import GAUGES, Scrape, render
from api.summary import cluster_summary, estimate_quantile, estimated_percentiles, window_rates
from api.totals import read_totals
from llmq import metrics
from llmq.embedded import EmbeddedRedis
from llmq.protocol import keys
from tests.support.exposition import samples, value
from tests.support.servers import RunningApi, SpawnWorkers, StartApi
from tests.support.waiting import wait_until

INF = math.inf


def test_quantile_interpolates_inside_the_bucket() -> None:
    cumulative = [(1.0, 10.0), (2.0, 20.0), (INF, 20.0)]
    assert estimate_quantile(0.5, cumulative) == pytest.approx(1.0)
    assert estimate_quantile(0.25, cumulative) == pytest.approx(0.5)
    assert estimate_quantile(0.75, cumulative) == pytest.approx(1.5)
    assert estimate_quantile(0.99, cumulative) == pytest.approx(1.98)


def test_quantile_edge_cases() -> None:
    assert estimate_quantile(0.5, [(1.0, 0.0), (INF, 0.0)]) is None
    # a rank in the +Inf bucket: the highest finite bound, as Prometheus does
    assert estimate_quantile(0.99, [(1.0, 1.0), (2.0, 1.0), (INF, 10.0)]) == 2.0
    # empty leading buckets are skipped
    assert estimate_quantile(0.5, [(1.0, 0.0), (2.0, 0.0), (4.0, 2.0), (INF, 2.0)]) == 3.0


async def test_recorder_flushes_deltas_that_exposition_renders(redis: Redis) -> None:
    tally = metrics.Tally()
    for v in (0.003, 0.003, 0.03, 0.3, 3000.0):
        tally.observe(metrics.TTFT, v, "m1")
    tally.inc(metrics.REQUESTS, "m1", "stop", amount=4)
    tally.inc(metrics.REQUESTS, "m1", "rejected")
    tally.inc(metrics.GENERATION_TOKENS, "m1", amount=40)
    await tally.flush(redis)
    assert tally.take() == {}, "a flush leaves nothing pending"
    tally.inc(metrics.REQUESTS, "m1", "stop")  # a second flush adds to the totals
    await tally.flush(redis)
    fields = await redis.hkeys(keys.metric(metrics.TTFT.name))  # type: ignore[misc]
    assert len(fields) == 6  # 4 buckets + sum + count

    totals = await read_totals(redis)
    text = render(Scrape(totals, [], {"m1": 0}, {})).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["llmq_requests"].type == "counter"
    assert families[metrics.TTFT.name].type == "histogram"
    assert set(GAUGES) <= set(families)
    assert value(text, "llmq_requests_total", finished_reason="stop") == 5
    assert value(text, "llmq_requests_total", finished_reason="rejected") == 1
    assert value(text, "llmq_generation_tokens_total", model="m1") == 40
    ttft = metrics.TTFT.name
    assert value(text, f"{ttft}_count", model="m1") == 5
    assert value(text, f"{ttft}_sum") == pytest.approx(3000.336)
    assert value(text, f"{ttft}_bucket", le="0.005") == 2
    assert value(text, f"{ttft}_bucket", le="0.04") == 3
    assert value(text, f"{ttft}_bucket", le="2560.0") == 4
    assert value(text, f"{ttft}_bucket", le="+Inf") == 5
    bounds = [s.labels["le"] for s in families[ttft].samples if s.name.endswith("_bucket")]
    assert len(bounds) == len(metrics.TTFT_BUCKETS) + 1

    p = estimated_percentiles(totals.histogram(metrics.TTFT), metrics.TTFT)
    assert p["p50"] is not None and 0.02 <= p["p50"] <= 0.04
    body = cluster_summary(totals, await window_rates(redis))
    assert body["requests"]["by_outcome"]["stop"] == 5
    assert body["requests"]["total"] == 6
    # both flushes happened within the window, averaged over all of it
    assert body["tokens_per_second"] == pytest.approx(40 / 60)


async def test_failed_flush_keeps_the_deltas(redis_url: str) -> None:
    tally = metrics.Tally()
    tally.inc(metrics.REQUESTS, "m1", "stop")
    dead = Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.5)
    with pytest.raises(Exception):  # noqa: B017 - any connection error
        await tally.flush(dead)
    await dead.aclose()
    alive = Redis.from_url(redis_url, decode_responses=True)
    await tally.flush(alive)
    totals = await read_totals(alive)
    await alive.aclose()
    assert totals.counters["llmq_requests"][("m1", "stop")] == 1


async def test_a_flush_applied_though_its_reply_was_lost_is_not_counted_twice(
    own_redis: EmbeddedRedis,
) -> None:
    """Redis stalls (``DEBUG SLEEP``) past the flush's read timeout, then applies it:
    the next flush finds its marker and does not send the deltas again."""
    tally = metrics.Tally()
    tally.inc(metrics.REQUESTS, "m1", "stop")
    admin = Redis.from_url(own_redis.url, decode_responses=True)
    impatient = Redis.from_url(own_redis.url, socket_timeout=0.2)
    await impatient.ping()  # connected: the stall catches the flush's own reply
    stalled = await admin.connection_pool.get_connection()
    await stalled.send_command("DEBUG", "SLEEP", "0.6")  # Redis stalls from now
    with pytest.raises(RedisTimeoutError):
        await tally.flush(impatient)
    await impatient.aclose()
    await stalled.read_response()
    await admin.connection_pool.release(stalled)
    await tally.flush(admin)
    totals = await read_totals(admin)
    await admin.aclose()
    assert totals.counters["llmq_requests"][("m1", "stop")] == 1


async def _request(client: httpx.AsyncClient, i: int) -> None:
    body: dict[str, Any] = {"model": "mock", "prompt": f"hello {i}", "max_tokens": 5}
    if i % 2:
        async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            assert r.status_code == 200
            async for _ in r.aiter_bytes():
                pass
    else:
        r = await client.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text


@pytest.mark.timeout(60)
@pytest.mark.slow
async def test_cluster_counts_survive_a_killed_worker(
    start_api: StartApi, spawn_workers: SpawnWorkers
) -> None:
    workers = await spawn_workers(2, concurrency=2)
    apis = [await start_api(), await start_api()]
    n = 12
    clients = [api.client() for api in apis]
    try:
        for i in range(n):
            await _request(clients[i % 2], i)

        async def counted(client: httpx.AsyncClient) -> bool:
            text = (await client.get("/metrics")).text
            return (
                value(text, "llmq_requests_total", finished_reason="length") == n
                and value(text, f"{metrics.E2E.name}_count") == n
                and value(text, "llmq_generation_tokens_total") == 5 * n
            )

        for client in clients:
            await wait_until(partial(counted, client), timeout=10, what="cluster counts")
        text = (await clients[0].get("/metrics")).text
        assert value(text, f"{metrics.TTFT.name}_count") == n
        assert value(text, f"{metrics.ITL.name}_count") == 4 * n
        assert value(text, "llmq_live_workers", model="mock") == 2
        assert value(text, "llmq_worker_starts_total", model="mock") == 2
        assert value(text, "llmq_capacity_requests", model="mock") == 4
        served = {
            ls for (name, ls), _ in samples(text).items() if name == "llmq_worker_running_requests"
        }
        assert len(served) == 2

        workers[0].popen.kill()
        workers[0].popen.wait(5)

        async def one_left() -> bool:
            r = await clients[1].get("/v1/workers")
            return len(r.json()["data"]) == 1

        await wait_until(one_left, timeout=10, what="the killed worker to leave /v1/workers")
        for client in clients:
            text = (await client.get("/metrics")).text
            assert value(text, "llmq_requests_total", finished_reason="length") == n
            assert value(text, "llmq_live_workers", model="mock") == 1
        summary = (await clients[1].get("/v1/metrics/summary")).json()
        assert summary["requests"]["by_outcome"]["length"] == n
        assert summary["latency"]["time_to_first_token_seconds"]["p50"] > 0
        assert summary["tokens_per_second"] > 0
    finally:
        for client in clients:
            await client.aclose()


async def test_rejected_and_queue_depth(start_api: StartApi) -> None:
    api = await start_api(accept_models="ghost", max_queue_depth=1)
    body = {"model": "ghost", "prompt": "wait", "max_tokens": 3}
    async with api.client() as client:
        assert (await client.post("/v1/requests", json=body)).status_code == 202
        assert (await client.post("/v1/requests", json=body)).status_code == 429

        async def rejected() -> bool:
            text = (await client.get("/metrics")).text
            return value(text, "llmq_requests_total", finished_reason="rejected") == 1

        await wait_until(rejected, timeout=5, what="the 429 to be counted")
        text = (await client.get("/metrics")).text
        assert value(text, "llmq_queue_depth", model="ghost") == 1
        assert value(text, "llmq_capacity_requests", model="ghost") == 0
        assert value(text, "llmq_utilization_ratio", model="ghost") == 0


async def test_unstarted_endings_are_counted(start_api: StartApi) -> None:
    """Cancelled while queued, and expired in the queue: no worker ever saw them."""
    api = await start_api(accept_models="ghost", sweep_seconds=0.05)
    async with api.client() as client:
        body = {"model": "ghost", "prompt": "wait", "max_tokens": 3}
        rid = (await client.post("/v1/requests", json=body)).json()["id"]
        assert (await client.delete(f"/v1/requests/{rid}")).status_code == 200
        expiring = {**body, "queue_timeout": 0.1}
        assert (await client.post("/v1/requests", json=expiring)).status_code == 202

        async def counted() -> bool:
            text = (await client.get("/metrics")).text
            return (
                value(text, "llmq_requests_total", model="ghost", finished_reason="cancelled") == 1
                and value(text, "llmq_requests_total", model="ghost", finished_reason="timeout")
                == 1
            )

        await wait_until(counted, timeout=10, what="cancelled and timeout to be counted")


@pytest.mark.timeout(30)
async def test_http_responses_are_counted_by_status_class_once_each(stack: RunningApi) -> None:
    """``llmq_http_responses_total`` counts a response once at its start: a stream of
    many chunks once, an error by its class; probes and scrapes not at all."""
    body = {"model": "mock", "prompt": "count me", "max_tokens": 8}
    async with stack.client() as client:
        streamed = {**body, "stream": True}
        async with client.stream("POST", "/v1/completions", json=streamed) as r:
            assert r.status_code == 200
            chunks = [line async for line in r.aiter_lines() if line.startswith("data: ")]
        assert len(chunks) > 2
        assert (await client.post("/v1/completions", json=body)).status_code == 200
        refused = await client.post("/v1/completions", json={**body, "max_tokens": 0})
        assert refused.status_code == 400
        slow = {**body, "max_tokens": 4000, "generation_timeout": 0.05}
        assert (await client.post("/v1/completions", json=slow)).status_code == 504
        for probe in ("/healthz", "/readyz", "/metrics"):
            await client.get(probe)

        async def flushed() -> bool:
            text = (await client.get("/metrics")).text
            return value(text, "llmq_http_responses_total", code_class="5xx") >= 1

        await wait_until(flushed, timeout=10, what="the 504 to be counted")
        text = (await client.get("/metrics")).text
    counted = {c: value(text, "llmq_http_responses_total", code_class=c) for c in ("2xx", "4xx")}
    assert counted == {"2xx": 2, "4xx": 1}
    assert value(text, "llmq_http_responses_total", code_class="5xx") == 1
