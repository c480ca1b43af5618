"""A graceful stop (SIGTERM) of an API process fails no request: before it closes its
connections it drains (``api/main.py``), so that a client never sends a request on a
connection just as the process closes it."""

from __future__ import annotations

import signal

import httpx
import pytest

from tests.support.native import wait_ready
from tests.support.processes import start_api_process
from tests.support.servers import StartWorker
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.timeout(60), pytest.mark.slow]

BODY = {"model": "mock", "prompt": "still there?", "max_tokens": 2}


async def test_a_stopping_api_serves_a_request_on_a_connection_idle_at_the_sigterm(
    start_worker: StartWorker, redis_url: str
) -> None:
    """One keep-alive connection is idle in the client's pool when SIGTERM arrives.
    The process fails readiness (its load balancer stops sending), and the next request
    on that connection is answered, with ``Connection: close``, instead of finding it
    closed (a reset: the client could not tell whether the request was taken)."""
    await start_worker()
    url, api = start_api_process(redis_url)
    one = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    try:
        async with (
            httpx.AsyncClient(base_url=url, timeout=10, limits=one) as client,
            httpx.AsyncClient(base_url=url, timeout=10) as probe,
        ):
            await wait_ready(client, timeout=30)  # its connection now idle in the pool
            api.popen.send_signal(signal.SIGTERM)

            async def not_ready() -> bool:
                r = await probe.get("/readyz")
                return r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"

            await wait_until(not_ready, timeout=10, what="readiness to fail")
            r = await client.post("/v1/requests", json=BODY)
            assert r.status_code == 202, r.text
            assert r.headers["connection"] == "close"
        assert api.popen.wait(30) in (0, -signal.SIGTERM)
    finally:
        api.stop()
