"""A rolling restart fails nothing: a pool of two API processes and two workers (real
processes, the mock) under clients of two tenants with quotas and a running batch;
every process in turn is sent SIGTERM, started again once it has exited, and waited
for (ready, registered) before the next. Afterwards every client request ended
``done`` with all its tokens (native streams resumed on the other API, OpenAI streams
finished within the API's shutdown grace, workers drained or handed back), no batch
line failed and every ``custom_id`` is in the output once with the undisturbed text,
no tenant holds a reservation or a place among its requests at once, and each
tenant's ``llmq_tenant_tokens_total`` is the sum over its requests' records.

The clients, batches and references are the chaos campaign's (``bench/chaos/``)."""

from __future__ import annotations

import asyncio
import functools
import random
import signal
import time
from typing import Any, cast

import httpx
import pytest
from redis.asyncio import Redis

from bench.chaos import batch, tenants
from bench.chaos.campaign import reference
from bench.chaos.checker import batch_custom_id
from bench.chaos.clients import Clients
from bench.chaos.history import BatchRun, Request, Spec
from llmq.embedded import free_port
from llmq.protocol import keys
from llmq.tenants import Tenant
from tests.support.native import wait_ready
from tests.support.processes import Proc, api_process_on, worker_process
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

WORKER: dict[str, Any] = {
    "model_tokens_per_second": 50,
    "model_stop_probability": 0.0,
    "model_mean_tokens": 0,
    "heartbeat_seconds": 0.2,
    "lease_seconds": 1.0,
    "drain_seconds": 1,
    "concurrency": 4,
}
#: The shutdown grace outlasts the longest stream (60 tokens at 50/s): an OpenAI
#: stream open at the SIGTERM ends on the API it started on.
API: dict[str, str] = {
    "LLMQ_TENANT_HEADER": "X-Tenant",
    "LLMQ_SHUTDOWN_GRACE_SECONDS": "5",
    "LLMQ_HEARTBEAT_SECONDS": "0.2",
    "LLMQ_ORPHAN_GRACE_SECONDS": "1",
    "LLMQ_SSE_KEEPALIVE_SECONDS": "1",
}
TENANTS = (
    Tenant(name="team-a", max_concurrent=200, tokens_per_minute=1_000_000),
    Tenant(name="team-b", max_concurrent=200, requests_per_minute=6000),
)
MAX_TOKENS = (20, 60)
#: Client arrivals while the restarts go on.
EVERY_SECONDS = 0.2


class Pool:
    """The pool's processes by name, each restarted on the same port or settings."""

    def __init__(self, redis_url: str) -> None:
        self.redis_url = redis_url
        self.ports = [free_port(), free_port()]
        self.apis = [api_process_on(port, redis_url, **API) for port in self.ports]
        self.workers = [worker_process(redis_url, **WORKER) for _ in range(2)]

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.ports]

    def all(self) -> list[Proc]:
        return [*self.apis, *self.workers]


async def _registered(redis: Redis) -> set[str]:
    return {str(w) for w in await cast("Any", redis.zrange(keys.WORKERS, 0, -1))}


async def _api_ready(url: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=5) as client:
        await wait_ready(client, timeout=60)


async def _stopped(proc: Proc) -> int:
    """Its exit code, once it exited by itself (its log then closed)."""
    code = await asyncio.to_thread(proc.wait, 30)
    await asyncio.to_thread(proc.stop)
    return code


async def _restart_all(pool: Pool, redis: Redis) -> None:
    """SIGTERM each process in turn; start it again once it exited; wait until ready."""
    for i in range(len(pool.apis)):
        pool.apis[i].signal(signal.SIGTERM)
        assert await _stopped(pool.apis[i]) in (0, -signal.SIGTERM), pool.apis[i].tail()
        pool.apis[i] = api_process_on(pool.ports[i], pool.redis_url, **API)
        await _api_ready(pool.urls[i])
    for i in range(len(pool.workers)):
        before = await _registered(redis)
        pool.workers[i].signal(signal.SIGTERM)
        assert await _stopped(pool.workers[i]) == 0, pool.workers[i].tail()
        pool.workers[i] = worker_process(pool.redis_url, **WORKER)

        await wait_until(
            functools.partial(_new_one, redis, before),
            timeout=60,
            what="the restarted worker to register",
        )


async def _clients(clients: Clients, stop: asyncio.Event, into: list[Request]) -> None:
    """Requests of both tenants, native and OpenAI, one every EVERY_SECONDS until
    ``stop``; returns once every one ended."""
    rng = random.Random(11)
    tasks = []
    while not stop.is_set():
        n = len(into)
        spec = Spec(
            n=n,
            kind="native" if n % 2 else "openai",
            seed=rng.randrange(1 << 30),
            prompt=f"rolling {n}",
            max_tokens=rng.randint(*MAX_TOKENS),
            tenant=TENANTS[n % len(TENANTS)].name,
        )
        r = Request(spec, submitted_at=clients.now())
        into.append(r)
        tasks.append(asyncio.create_task(clients.run(r, random.Random(n))))
        await asyncio.sleep(EVERY_SECONDS)
    await asyncio.gather(*tasks)


async def _record_tokens(redis: Redis, requests: list[Request]) -> dict[str, float]:
    """Prompt + completion tokens per tenant, summed over the requests' records."""
    out = {t.name: 0.0 for t in TENANTS}
    for r in requests:
        assert r.request_id is not None
        prompt, completion = await cast(
            "Any",
            redis.hmget(keys.request(r.request_id), ["prompt_tokens", "completion_tokens"]),
        )
        out[r.spec.tenant] += int(prompt or 0) + int(completion or 0)
    return out


def _batch_failures(run: BatchRun) -> list[str]:
    """What is wrong with a batch that should have every line once, exact, none failed."""
    wrong = [] if run.status == "completed" and not run.error else [f"{run.status} {run.error}"]
    wrong += [f"{custom_id} failed: {code}" for custom_id, code in run.errors]
    ids = [custom_id for custom_id, _ in run.output]
    if sorted(ids) != sorted(batch_custom_id(spec) for spec in run.specs):
        wrong.append(f"custom_ids not each once: {len(ids)} lines, {len(set(ids))} distinct")
    return wrong


async def test_a_rolling_restart_of_every_process_fails_no_request_and_no_batch_line(
    redis_url: str, redis: Redis
) -> None:
    await tenants.create(redis, TENANTS)
    pool = Pool(redis_url)
    requests: list[Request] = []
    runs: list[BatchRun] = []
    try:
        for url in pool.urls:
            await _api_ready(url)
        await wait_until(
            lambda: _has(redis, 2), timeout=60, what="two workers to register", interval=0.1
        )
        clients = Clients(pool.urls, time.monotonic())
        stop = asyncio.Event()
        batches = asyncio.create_task(
            batch.throughout(pool.urls, 5, 40, MAX_TOKENS, clients.now, stop, 60.0, runs)
        )
        load = asyncio.create_task(_clients(clients, stop, requests))
        await wait_until(lambda: len(requests) >= 10, timeout=30, what="clients under way")
        restarting = clients.now()
        await _restart_all(pool, redis)
        restarted = clients.now()
        stop.set()
        async with asyncio.timeout(90):
            await load
            await batches
    finally:
        await asyncio.gather(*(asyncio.to_thread(p.stop) for p in pool.all()))
    failed = [
        f"{r.spec.kind} {r.spec.n} ({r.request_id}): {r.outcome}/{r.finish_reason} {r.error}"
        for r in requests
        if r.outcome != "done" or r.finish_reason != "length"
    ]
    assert not failed, failed[:10]
    for r in requests:
        ref = await reference(r.spec, WORKER)
        got = r.tokens() if r.spec.kind == "native" else r.text
        assert got == (ref if r.spec.kind == "native" else "".join(ref)), r
        assert r.usage_tokens == len(ref), r
    # a batch ran throughout: the first began before the restarts, the last ended after
    assert runs[0].created_at < restarting and (runs[-1].ended_at or 0) > restarted, runs
    for run in runs:
        assert not _batch_failures(run), _batch_failures(run)
        texts = dict(run.output)
        for spec in run.specs:
            assert texts[batch_custom_id(spec)] == "".join(await reference(spec, WORKER))
    names = [t.name for t in TENANTS]
    assert await tenants.quotas(redis, names) == {
        name: {"reserved": 0, "inflight": 0} for name in names
    }
    want = await _record_tokens(redis, requests)

    async def counted() -> bool:
        return await tenants.tokens(redis, names) == want

    await wait_until(counted, timeout=10, what=f"tenant tokens {want}", interval=0.2)


async def _new_one(redis: Redis, before: set[str]) -> bool:
    return bool(await _registered(redis) - before)


async def _has(redis: Redis, workers: int) -> bool:
    return len(await _registered(redis)) >= workers
