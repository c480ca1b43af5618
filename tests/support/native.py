"""Small helpers over the native API for tests."""

from __future__ import annotations

from typing import Any

import httpx

from tests.support.servers import RunningApi
from tests.support.waiting import wait_until


async def post_request(client: httpx.AsyncClient, prompt: str = "p", **body: Any) -> str:
    """POST a native request for ``mock``; its id once it is accepted (202)."""
    r = await client.post("/v1/requests", json={"model": "mock", "prompt": prompt, **body})
    assert r.status_code == 202, r.text
    rid: str = r.json()["id"]
    return rid


async def record(client: httpx.AsyncClient, rid: str) -> dict[str, Any]:
    r = await client.get(f"/v1/requests/{rid}")
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


async def wait_status(
    client: httpx.AsyncClient, rid: str, *statuses: str, timeout: float = 20
) -> dict[str, Any]:
    found: dict[str, Any] = {}

    async def reached() -> bool:
        found.update(await record(client, rid))
        return found["status"] in statuses

    await wait_until(reached, timeout=timeout, what=f"{rid} to be {'/'.join(statuses)}")
    return found


async def wait_ready(client: httpx.AsyncClient, timeout: float = 10, path: str = "/readyz") -> None:
    """Until ``path`` answers 200; a server still starting (refused) is waited for."""

    async def ready() -> bool:
        try:
            return (await client.get(path)).status_code == 200
        except httpx.TransportError:
            return False

    await wait_until(ready, timeout=timeout, what=path)


async def workers(client: httpx.AsyncClient) -> list[dict[str, Any]]:
    """The registered workers (``/v1/workers``)."""
    data: list[dict[str, Any]] = (await client.get("/v1/workers")).json()["data"]
    return data


async def ready_workers(api: RunningApi, count: int) -> None:
    """Until ``count`` workers are registered and ready (each has connected to its server)."""

    async def up() -> bool:
        async with api.client() as client:
            return sum(bool(w["ready"]) for w in await workers(client)) == count

    await wait_until(up, timeout=30, what=f"{count} ready workers")
