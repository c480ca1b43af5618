"""Fixtures: a private redis-server per session, flushed per test, and llmq parts.

Nothing here fakes Redis: every test talks to a real ``redis-server`` on a free
port. ``start_worker``/``start_api`` run real workers and a real uvicorn server in
the test's event loop (their handles are in :mod:`tests.support.servers`); the
end-to-end tests in ``tests/e2e`` use processes.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from redis.asyncio import Redis, RedisCluster

from api.app import create_app
from bench.procs import FIXED_LENGTHS
from llmq.connection import connect
from llmq.embedded import EmbeddedRedis, free_port
from llmq.model.interface import Backend
from llmq.policy import store as policy_store
from llmq.policy.fields import POLICY_NAMES
from llmq.protocol import keys
from llmq.protocol import policy as stored_policy
from llmq.settings import ApiSettings, CommonSettings, WorkerSettings
from rigs.embedded_cluster import EmbeddedCluster
from tests.support.cluster import redis_cluster  # noqa: F401 (the cluster fixture)
from tests.support.native import wait_ready
from tests.support.phoenix import phoenix  # noqa: F401 (the trace backend fixture)
from tests.support.processes import Proc, clean_env
from tests.support.servers import (
    FAST_MODEL,
    ResponseLog,
    RunningApi,
    RunningWorker,
    SpawnWorkers,
    StartApi,
    StartWorker,
    start_uvicorn,
)
from tests.support.waiting import wait_until
from worker.main import serve


@pytest.fixture(scope="session")
def redis_server() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as server:
        yield server


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """A private Redis with AOF on, that a test may kill, stall and restart (it accepts
    ``DEBUG SLEEP``). Every write is on disk before its reply (``appendfsync always``):
    with ``everysec`` a write may wait behind a slow fsync on a busy disk while its
    reply goes out, and a SIGKILL then loses what Redis had acknowledged."""
    server = EmbeddedRedis(
        appendonly=True,
        directory=str(tmp_path),
        extra_args=("--enable-debug-command", "local", "--appendfsync", "always"),
    )
    server.start()
    yield server
    if server.process is not None:
        server.process.send_signal(signal.SIGCONT)  # a test that failed mid-stall
    server.stop(remove=False)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """The Redis a test runs on: ``single`` unless the test is parametrized with
    :data:`tests.support.cluster.BOTH_BACKENDS` (then once on each)."""
    return str(getattr(request, "param", "single"))


@pytest.fixture
async def redis(backend: str, request: pytest.FixtureRequest) -> AsyncIterator[Redis]:
    """The test's client, on a flushed Redis: a plain one, or on the session's Redis
    Cluster a cluster client (routing by slot)."""
    client: Redis
    if backend == "cluster":
        cluster: EmbeddedCluster = request.getfixturevalue("redis_cluster")
        cluster.flush()
        client = cast(
            Redis,
            RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port, decode_responses=True),
        )
    else:
        server: EmbeddedRedis = request.getfixturevalue("redis_server")
        client = Redis.from_url(server.url, decode_responses=True)
        await client.flushall()
    yield client
    await client.aclose()


@pytest.fixture
def redis_url(backend: str, request: pytest.FixtureRequest, redis: Redis) -> str:
    """The URL the llmq parts of the test connect with (``redis+cluster://`` on the cluster)."""
    if backend == "cluster":
        cluster: EmbeddedCluster = request.getfixturevalue("redis_cluster")
        return cluster.url
    server: EmbeddedRedis = request.getfixturevalue("redis_server")
    return server.url


#: The pool policy a test's parts run under where the test sets none: claims in the
#: queue's order, which every test of something else than routing assumes (a pool of
#: mocks, whose engine keeps a prefix cache, would derive ``prefix``), and the bound of
#: a request without ``max_tokens`` that the test processes' environment sets
#: (:data:`bench.procs.FIXED_LENGTHS`), so that they find the pool agreeing with it.
PINNED = {"routing": "fifo", "default_max_tokens": int(FIXED_LENGTHS["LLMQ_DEFAULT_MAX_TOKENS"])}


async def set_pool_policy(redis_url: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """The pool policy's values among a part's ``overrides`` go into the pool's policy
    (as ``llmq config set`` puts them); the rest, the part's own settings, are returned.

    Where the test gives none of :data:`PINNED`'s keys and the pool's document sets
    none, the first part pins it there; a test sets its own (``routing=NAME``, or
    ``llmq config set`` before starting its parts), or none with ``routing=None``: the
    value derived from the workers then holds."""
    given = {k: overrides[k] for k in overrides if k in POLICY_NAMES}
    policy = {k: v for k, v in given.items() if v is not None}
    client = connect(CommonSettings(redis_url=redis_url))
    try:
        pool = (await stored_policy.read(client)).pool
        policy |= {k: v for k, v in PINNED.items() if k not in given and k not in pool}
        if policy:
            await policy_store.set_values(client, policy, None, "tests")
    finally:
        await client.aclose(close_connection_pool=True)
    return {k: v for k, v in overrides.items() if k not in given}


@pytest.fixture
async def start_worker(redis_url: str) -> AsyncIterator[StartWorker]:
    """Start real workers in this event loop; each is stopped at teardown."""
    workers: list[RunningWorker] = []

    async def start(backend: Backend | None = None, **overrides: Any) -> RunningWorker:
        """``backend``: run this model object instead of the settings' mock (e.g. one
        that fails). Pool policy values among ``overrides`` are set in the pool's policy."""
        chosen: dict[str, Any] = {
            "redis_url": redis_url,
            "heartbeat_seconds": 0.2,
            "drain_seconds": 1,
            **FAST_MODEL,
            **await set_pool_policy(overrides.get("redis_url", redis_url), overrides),
        }
        settings = WorkerSettings(**chosen)
        stop = asyncio.Event()
        task = asyncio.create_task(serve(settings, stop=stop, backend=backend))
        running = RunningWorker(settings, stop, task)
        workers.append(running)
        return running

    yield start
    await asyncio.gather(*(w.close() for w in workers))


@pytest.fixture
async def start_api(redis_url: str) -> AsyncIterator[StartApi]:
    """Start a real uvicorn server (real sockets) in this event loop."""
    apis: list[RunningApi] = []

    async def start(**overrides: Any) -> RunningApi:
        # the mock of the tests never stops by itself: a bound for requests without
        # max_tokens (the default is the limit, 4096 tokens)
        chosen: dict[str, Any] = {
            "redis_url": redis_url,
            "port": free_port(),
            **await set_pool_policy(
                overrides.get("redis_url", redis_url), {"default_max_tokens": 128, **overrides}
            ),
        }
        settings = ApiSettings(**chosen)
        responses = ResponseLog(create_app(settings))
        server, task = start_uvicorn(responses, settings.port, lifespan="on")
        api = RunningApi(settings, server, task, responses)
        apis.append(api)
        await wait_until(lambda: server.started, timeout=10, what="uvicorn to start")
        return api

    yield start
    for api in apis:
        api.server.should_exit = True
    async with asyncio.timeout(15):
        await asyncio.gather(*(api.task for api in apis))


async def _ready_stack(start_api: StartApi, start_worker: StartWorker, **worker: Any) -> RunningApi:
    await start_worker(**worker)
    api = await start_api()
    async with api.client() as client:
        await wait_ready(client)
    return api


@pytest.fixture
async def stack(start_api: StartApi, start_worker: StartWorker) -> RunningApi:
    """One API and one worker, ready to serve the ``mock`` model."""
    return await _ready_stack(start_api, start_worker)


@pytest.fixture
async def fast(start_api: StartApi, start_worker: StartWorker) -> RunningApi:
    """A stack whose mock decodes 2000 tokens/s: whole JSON documents in milliseconds."""
    return await _ready_stack(start_api, start_worker, model_tokens_per_second=2000.0)


@pytest.fixture
async def spawn_workers(redis_url: str, redis: Redis) -> AsyncIterator[SpawnWorkers]:
    """Start ``llmq worker`` processes; returns once all are in the registry."""
    procs: list[Proc] = []

    async def spawn(n: int = 1, **settings: Any) -> list[Proc]:
        own = await set_pool_policy(str(settings.get("redis_url", redis_url)), settings)
        chosen = {"heartbeat_seconds": 0.2, "drain_seconds": 1, **FAST_MODEL, **own}
        env = clean_env(
            LLMQ_REDIS_URL=redis_url,
            **{f"LLMQ_{k.upper()}": str(v) for k, v in chosen.items()},
        )
        new = [Proc(["worker"], env) for _ in range(n)]
        procs.extend(new)
        expected = len(procs)

        async def registered() -> bool:
            return int(await redis.zcard(keys.WORKERS)) >= expected

        await wait_until(registered, timeout=30, what=f"{expected} workers to register")
        return new

    yield spawn
    await asyncio.gather(*(asyncio.to_thread(p.stop) for p in procs))
