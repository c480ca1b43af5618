"""Cache- and session-aware routing across real processes: an API and ``llmq worker``s.

The workers run the mock's engine, whose KV cache reports the blocks it holds; the
workers publish them; the API names each prompt's blocks. So a request follows the
worker that ran its prefix, though the other is idle and parked first, unless the
holder is far busier (the load guard) or the request waited past the bound (the
wait guard); a session follows its last worker; a killed worker's cache is
forgotten with its registration. Under ``fifo`` the hand-off takes turns between
parked workers, which the sticking assertions would catch.
"""

from __future__ import annotations

import signal
from collections.abc import Awaitable
from typing import Any, cast

import httpx
import pytest
from redis.asyncio import Redis

from llmq.model.blocks import block_hashes
from llmq.protocol import keys
from tests.support.cluster import BOTH_BACKENDS
from tests.support.native import post_request, record, wait_status
from tests.support.processes import Proc
from tests.support.servers import RunningApi, SpawnWorkers, StartApi
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

#: A prompt of 8 blocks (16 words each).
PREFIX = " ".join(f"sys{i}" for i in range(128))


async def stack(
    spawn_workers: SpawnWorkers, start_api: StartApi, workers: int = 2, **routing: Any
) -> tuple[list[Proc], RunningApi]:
    """Workers of one slot each and an API, all routing by ``prefix`` with ``routing``."""
    chosen = {"routing": "prefix", **routing}
    procs = await spawn_workers(workers, concurrency=1, **chosen)
    return procs, await start_api(**chosen)


async def run(client: httpx.AsyncClient, prompt: str, **body: Any) -> dict[str, Any]:
    """Submit and wait until it is done; its record (``worker``: who ran it)."""
    rid = await post_request(client, prompt, max_tokens=body.pop("max_tokens", 2), **body)
    return await wait_status(client, rid, "done", timeout=30)


async def cached(redis: Redis, worker: str, prompt: str) -> None:
    """Wait until ``worker`` published the prompt's first block as cached."""
    first = block_hashes(prompt.split())[0]

    async def published() -> bool:
        found = redis.sismember(keys.cache(worker, "mock"), first)
        return bool(await cast("Awaitable[int]", found))

    await wait_until(published, timeout=10, what=f"{worker} to publish its cache")


async def both_parked(redis: Redis) -> None:
    async def parked() -> bool:
        return int(await redis.zcard(keys.parked("mock"))) == 2

    await wait_until(parked, timeout=10, what="both workers to park")


async def busy_holder(client: httpx.AsyncClient, redis: Redis, max_tokens: int) -> tuple[str, str]:
    """The worker holding PREFIX, now running a long request of that prefix (which goes
    to it), the other worker parked; returns the holder and the long request's id."""
    holder = (await run(client, PREFIX + " first"))["worker"]
    await cached(redis, holder, PREFIX)
    await both_parked(redis)
    long = await post_request(client, PREFIX + " long", max_tokens=max_tokens, ignore_eos=True)
    assert (await wait_status(client, long, "running"))["worker"] == holder
    return holder, long


@BOTH_BACKENDS
async def test_a_request_goes_to_the_worker_holding_its_prefix_though_another_is_parked(
    spawn_workers: SpawnWorkers, start_api: StartApi, redis: Redis
) -> None:
    _, api = await stack(spawn_workers, start_api)
    async with api.client() as client:
        holder = (await run(client, PREFIX + " first question"))["worker"]
        await cached(redis, holder, PREFIX)
        ran = []
        for i in range(3):
            await both_parked(redis)  # the other parked first: fifo would hand it this one
            ran.append((await run(client, PREFIX + f" question {i}"))["worker"])
    assert ran == [holder] * 3


@pytest.mark.slow
async def test_a_request_waits_for_its_busy_holder_within_the_bound(
    spawn_workers: SpawnWorkers, start_api: StartApi, redis: Redis
) -> None:
    _, api = await stack(spawn_workers, start_api, routing_max_wait_ms=60_000)
    async with api.client() as client:
        holder, long = await busy_holder(client, redis, max_tokens=300)
        follower = await run(client, PREFIX + " next")
        long_done = await record(client, long)
    assert follower["worker"] == holder
    assert follower["started_at"] >= long_done["finished_at"] - 0.05


async def test_the_wait_bound_lets_an_idle_worker_take_it(
    spawn_workers: SpawnWorkers, start_api: StartApi, redis: Redis
) -> None:
    _, api = await stack(spawn_workers, start_api, routing_max_wait_ms=300)
    async with api.client() as client:
        holder, long = await busy_holder(client, redis, max_tokens=600)
        follower = await run(client, PREFIX + " next")
        assert (await record(client, long))["status"] == "running"
    assert follower["worker"] != holder
    assert follower["started_at"] - follower["created_at"] >= 0.3
    assert int(await redis.hget(keys.routing_stats("mock"), "guard_wait") or 0) >= 1  # type: ignore[misc]


async def test_a_saturated_holder_is_not_waited_for(
    spawn_workers: SpawnWorkers, start_api: StartApi, redis: Redis
) -> None:
    _, api = await stack(spawn_workers, start_api, routing_max_wait_ms=60_000, routing_imbalance=0)
    async with api.client() as client:
        holder, long = await busy_holder(client, redis, max_tokens=600)
        follower = await run(client, PREFIX + " next")
        assert (await record(client, long))["status"] == "running"
    assert follower["worker"] != holder


async def test_a_session_sticks_to_its_worker(
    spawn_workers: SpawnWorkers, start_api: StartApi, redis: Redis
) -> None:
    _, api = await stack(spawn_workers, start_api)
    async with api.client() as client:
        ran = []
        for turn in range(4):
            await both_parked(redis)
            ran.append((await run(client, f"turn{turn} of a chat", user="alice"))["worker"])
    assert len(set(ran)) == 1, ran


@pytest.mark.slow
async def test_a_killed_workers_cache_is_forgotten(
    spawn_workers: SpawnWorkers, start_api: StartApi, redis: Redis
) -> None:
    procs, api = await stack(spawn_workers, start_api, worker_ttl_seconds=2)
    async with api.client() as client:
        holder = (await run(client, PREFIX + " first"))["worker"]
        await cached(redis, holder, PREFIX)
        next(p for p in procs if f"-{p.pid}-" in holder).signal(signal.SIGKILL)

        async def forgotten() -> bool:
            return not await redis.exists(keys.cache(holder, "mock"))

        await wait_until(forgotten, timeout=15, what="the killed worker's cache to expire")
        follower = await run(client, PREFIX + " next")
    assert follower["worker"] != holder


async def test_a_worker_measures_and_publishes_its_pace(
    spawn_workers: SpawnWorkers, start_api: StartApi, redis: Redis
) -> None:
    """The adaptive load guard's figures come from the worker's own runs: the time a
    run holds its slot, and the prefill time of a block (the slope of the first
    token's time over the uncached prompt, here the mock's 0.5 ms a token)."""
    _, api = await stack(
        spawn_workers, start_api, workers=1, model_prefill_seconds_per_token=0.0005
    )
    async with api.client() as client:
        for i, words in enumerate((16, 400, 800, 200)):
            done = await run(client, " ".join(f"p{i}w{j}" for j in range(words)))
        worker = done["worker"]

        load: list[int] = []

        async def published() -> bool:
            raw = await cast("Awaitable[str | None]", redis.hget(keys.loads("mock"), worker))
            load[:] = [int(f) for f in (raw or "0|0|0|0").split("|")]
            return load[3] > 0

        await wait_until(published, timeout=15, what="the worker to publish its pace")
    running, capacity, service_ms, block_us = load
    assert (running, capacity) == (0, 1)
    assert service_ms > 0, load
    assert 0.5 * 16 * 500 <= block_us <= 2 * 16 * 500, load
