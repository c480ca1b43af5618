"""``llmq api --api-processes N``: N complete API processes on one port, supervised:
stopped as one, a dead one restarted."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import time

import httpx
import pytest
from redis.asyncio import Redis

from api.main import _server
from llmq.collector import YOUNG_COLLECTION_THRESHOLD
from llmq.embedded import free_port
from llmq.protocol import keys
from llmq.settings import ApiSettings
from tests.support.native import wait_ready
from tests.support.processes import Proc, alive, children_of, clean_env, logged_restart, reap
from tests.support.runs import undisturbed
from tests.support.servers import StartWorker
from tests.support.sse import openai_chunks
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(90)

PROCESSES = 2
STREAMS = 24


def start(redis_url: str) -> tuple[Proc, str]:
    port = free_port()
    env = clean_env(LLMQ_REDIS_URL=redis_url, LLMQ_PORT=str(port))
    return Proc(["api", "--api-processes", str(PROCESSES)], env), f"http://127.0.0.1:{port}"


async def wait_leases(redis: Redis) -> None:
    """Until every API process holds a live lease of its own."""

    async def leased() -> bool:
        live = await redis.zcount(keys.APIS, time.time() * 1000, "+inf")
        return int(live) == PROCESSES

    await wait_until(leased, timeout=20, what=f"{PROCESSES} API leases")


@pytest.mark.slow
async def test_processes_share_the_port_and_each_serves_streams(
    redis_url: str, redis: Redis, start_worker: StartWorker
) -> None:
    await start_worker(concurrency=STREAMS, model_tokens_per_second=50)
    api, url = start(redis_url)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            await wait_ready(client, timeout=30)
            await wait_leases(redis)
            attached: set[str] = set()

            async def one(i: int) -> list[object]:
                body = {
                    "model": "mock",
                    "prompt": f"s{i}",
                    "max_tokens": 40,
                    "seed": i,
                    "stream": True,
                }
                # A connection each, so that the kernel spreads them over the processes.
                async with (
                    httpx.AsyncClient(base_url=url, timeout=30) as own,
                    own.stream("POST", "/v1/completions", json=body) as response,
                ):
                    assert response.status_code == 200
                    return await openai_chunks(response)

            streams = asyncio.gather(*(one(i) for i in range(STREAMS)))
            while not streams.done():
                async for key in redis.scan_iter(match=keys.attached("*")):
                    attached.add(key)
                await asyncio.sleep(0.05)
            results = await streams
        # Every token once, in order; a chunk may carry several (a flush coalesced them).
        for i, chunks in enumerate(results):
            text = "".join(c["choices"][0].get("text") or "" for c in chunks if c["choices"])  # type: ignore[index]
            assert text == "".join(await undisturbed(40, i)), f"stream {i}"
        # Both processes accepted streams: each attached some to its own lease.
        assert len(attached) == PROCESSES
        servers = children_of(api.pid)
        assert len(servers) == PROCESSES
        assert api.stop(timeout=30) == 0
        await wait_until(lambda: not any(alive(p) for p in servers), timeout=10, what="exit")
    finally:
        api.stop()
        reap(children_of(api.pid))


@pytest.mark.slow
async def test_a_killed_process_is_restarted_and_the_others_go_on(
    redis_url: str, redis: Redis
) -> None:
    api, url = start(redis_url)
    servers: list[int] = []
    try:
        async with httpx.AsyncClient(base_url=url, timeout=5) as client:
            await wait_ready(client, timeout=30, path="/healthz")
            await wait_leases(redis)
            servers = children_of(api.pid)
            assert len(servers) == PROCESSES
            os.kill(servers[0], signal.SIGKILL)
            await wait_until(
                lambda: len(set(children_of(api.pid)) - set(servers)) == 1,
                timeout=30,
                what="a new API process",
            )
            assert api.running(), "the command must survive one process's death"
            assert alive(servers[1]), "the other process goes on serving"
            # The new process serves the port: its lease is live beside the others.
            restarted = (set(children_of(api.pid)) - set(servers)).pop()

            async def leased() -> bool:  # a lease's id names its process: api-HOST-PID-...
                live = await redis.zrangebyscore(keys.APIS, time.time() * 1000, "+inf")
                return any(f"-{restarted}-" in lease for lease in live)

            await wait_until(leased, timeout=20, what="the new process's lease")
            assert (await client.get("/healthz")).status_code == 200
        out = api.output()
        assert logged_restart(out, "api-1", servers[0]), out[-3000:]
        kids = children_of(api.pid)
        assert api.stop(timeout=30) == 0
        await wait_until(lambda: not any(alive(p) for p in kids), timeout=10, what="exit")
    finally:
        api.stop()
        reap(servers + children_of(api.pid))


def test_the_garbage_collector_is_tuned_for_streaming_before_serving() -> None:
    """The app and the modules are frozen (collections skip them) and young
    collections are rare, so that they do not stall every stream several times a second."""
    thresholds = gc.get_threshold()
    gc.unfreeze()
    try:
        _server(ApiSettings(redis_url="redis://127.0.0.1:1", port=free_port()))
        assert gc.get_freeze_count() > 10_000
        assert gc.get_threshold()[0] == YOUNG_COLLECTION_THRESHOLD > thresholds[0]
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
