"""A native client that reconnects with the id of the final event (or a later one)
already has the whole answer: its stream ends at once, with nothing in it, instead of
sending keep-alives forever."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.support.models import Flaky
from tests.support.native import post_request, wait_status
from tests.support.servers import StartApi, StartWorker
from tests.support.sse import frames


async def _final_id(client: httpx.AsyncClient, rid: str) -> tuple[str, str]:
    """The id and type of the request's last event, read from the start."""
    last: tuple[str, str] = ("", "")
    async with client.stream("GET", f"/v1/requests/{rid}/events") as response:
        async for frame in frames(response):
            last = (frame.id or "", frame.event or "")
    return last


async def _resumed(client: httpx.AsyncClient, rid: str, last_id: str) -> bytes:
    """Everything a reconnect with ``last_id`` receives. The API sends a keep-alive
    every 0.1 s while a stream stays open, so a stream kept open shows one at once."""
    body = b""
    async with asyncio.timeout(30):
        async with client.stream(
            "GET", f"/v1/requests/{rid}/events", headers={"Last-Event-ID": last_id}
        ) as response:
            assert response.status_code == 200
            async for chunk in response.aiter_bytes():
                body += chunk
                assert not body.startswith(b":"), "the stream stayed open with keep-alives"
    return body


def _later(stream_id: str) -> str:
    ms, seq = stream_id.split("-")
    return f"{int(ms) + 1}-{seq}"


@pytest.mark.parametrize("ending", ["done", "failed"])
async def test_a_resume_from_the_final_event_ends_at_once(
    start_api: StartApi, start_worker: StartWorker, ending: str
) -> None:
    if ending == "done":
        await start_worker()
    else:
        await start_worker(backend=Flaky(), max_tries=1)
    api = await start_api(sse_keepalive_seconds=0.1)
    async with api.client() as client:
        rid = await post_request(client, "please explode", max_tokens=8)
        await wait_status(client, rid, ending)
        final, kind = await _final_id(client, rid)
        assert kind == ("done" if ending == "done" else "error")
        assert await _resumed(client, rid, final) == b""
        assert await _resumed(client, rid, _later(final)) == b""
