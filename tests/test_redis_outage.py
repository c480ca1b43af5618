"""Redis restarted or briefly gone: clear 503s meanwhile, recovery without restarts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from api.app import create_app
from llmq.embedded import EmbeddedRedis, free_port
from llmq.settings import ApiSettings, WorkerSettings
from tests.native import submit, wait_ready, wait_status
from tests.waiting import wait_until
from worker.main import serve

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """A private Redis with AOF on, that this test may kill and restart."""
    server = EmbeddedRedis(appendonly=True, directory=str(tmp_path))
    server.start()
    yield server
    server.stop(remove=False)


async def test_outage_and_restart(own_redis: EmbeddedRedis) -> None:
    url = own_redis.url
    stop = asyncio.Event()
    worker = asyncio.create_task(
        serve(
            WorkerSettings(
                redis_url=url,
                redis_pool_timeout_seconds=1.0,
                redis_socket_timeout_seconds=1.0,
                heartbeat_seconds=0.2,
                drain_seconds=1,
            ),
            stop=stop,
        )
    )
    settings = ApiSettings(
        redis_url=url,
        redis_pool_timeout_seconds=1.0,
        redis_socket_timeout_seconds=1.0,
        port=free_port(),
        relay_block_ms=500,
    )
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(settings),
            port=settings.port,
            log_config=None,
            lifespan="on",
            timeout_graceful_shutdown=2,
        )
    )
    api = asyncio.create_task(server.serve())
    await wait_until(lambda: server.started, timeout=10, what="uvicorn to start")
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{settings.port}", timeout=10) as c:
            await wait_ready(c)
            await wait_status(c, await submit(c, "before", max_tokens=3), "done")

            own_redis.kill()
            # the outage outlasts the worker's 0.5 s fallback poll, so it has to cope
            await asyncio.sleep(1.2)
            t0 = time.monotonic()
            down = await c.post("/v1/completions", json={"model": "mock", "prompt": "x"})
            refused_in = time.monotonic() - t0
            ready = await c.get("/readyz")
            health = await c.get("/healthz")

            own_redis.start()
            await wait_ready(c, timeout=20)
            after = await c.post(
                "/v1/completions", json={"model": "mock", "prompt": "after", "max_tokens": 4}
            )
    finally:
        server.should_exit = True
        stop.set()
        await asyncio.gather(api, worker)
    assert down.status_code == 503 and down.json()["error"]["code"] == "backend_unavailable"
    assert refused_in < 5
    assert ready.status_code == 503 and health.status_code == 200
    assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 4


async def test_queued_requests_survive_a_restart_with_aof(own_redis: EmbeddedRedis) -> None:
    settings = ApiSettings(
        redis_url=own_redis.url, port=free_port(), accept_models="mock", relay_block_ms=500
    )
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(settings),
            port=settings.port,
            log_config=None,
            lifespan="on",
            timeout_graceful_shutdown=2,
        )
    )
    api = asyncio.create_task(server.serve())
    await wait_until(lambda: server.started, timeout=10, what="uvicorn to start")
    stop = asyncio.Event()
    worker: asyncio.Task[None] | None = None
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{settings.port}", timeout=10) as c:
            rid = await submit(c, "wait for me", max_tokens=5)  # no worker yet: it waits
            own_redis.stop(remove=False)  # a restart: SIGTERM, AOF flushed
            own_redis.start()
            worker = asyncio.create_task(
                serve(WorkerSettings(redis_url=own_redis.url, heartbeat_seconds=0.2), stop=stop)
            )
            done = await wait_status(c, rid, "done", timeout=20)
    finally:
        server.should_exit = True
        stop.set()
        await asyncio.gather(api, *([worker] if worker else []))
    assert done["completion_tokens"] == 5
