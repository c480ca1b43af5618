"""Screenshots of every console page, for docs/console.md: ``python -m
tests.support.console_shots [--out docs/console]``.

It starts what the browser tests start (a private Redis, two mock workers and an API
in this process), gives the pool something to show (tenants and keys, a running
request, a queue, a batch under way, a model's policy override, an admin action),
then has Debian's Chromium (``/usr/bin/chromium``, through Playwright) open each
page at a laptop's width, and the pool page at a phone's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from pathlib import Path

import httpx
from playwright.async_api import Page, ViewportSize, async_playwright
from redis.asyncio import Redis

from api.app import create_app
from llmq.admin import create_admin_key
from llmq.embedded import EmbeddedRedis, free_port
from llmq.settings import ApiSettings, WorkerSettings
from llmq.tenants import Tenant, TenantStore
from tests.support.servers import FAST_MODEL, start_uvicorn
from tests.support.waiting import wait_until
from worker.main import serve

CHROMIUM = "/usr/bin/chromium"
LAPTOP = ViewportSize(width=1280, height=800)
PHONE = ViewportSize(width=390, height=844)
HELLO = [{"role": "user", "content": "hi"}]


async def _scene(api: str, redis_url: str) -> tuple[str, str]:
    """Tenants, keys, requests and a batch; the admin key and a running request's id."""
    redis = Redis.from_url(redis_url, decode_responses=True)
    store = TenantStore(redis)
    for tenant in (
        Tenant(name="acme", weight=3, tokens_per_minute=200_000),
        Tenant(name="globex", requests_per_minute=60),
    ):
        await store.put(tenant)
        await store.create_key(tenant.name)
    admin_key = await create_admin_key(redis, "ops")
    await redis.aclose()
    async with httpx.AsyncClient(base_url=api, timeout=30) as client:

        async def ready() -> bool:
            return (await client.get("/readyz")).status_code == 200

        await wait_until(ready, timeout=30, what="the pool to be ready")
        ids = []
        for i in range(24):
            body = {
                "model": "mock",
                "prompt": f"question {i}",
                "max_tokens": 400,
                "priority": i % 3,
            }
            ids.append((await client.post("/v1/requests", json=body)).json()["id"])
        lines = [
            {
                "custom_id": f"l{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": "mock",
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 8,
                },
            }
            for i in range(50)
        ]
        content = "".join(json.dumps(line) + "\n" for line in lines)
        uploaded = await client.post(
            "/v1/files", files={"file": ("in.jsonl", content)}, data={"purpose": "batch"}
        )
        await client.post(
            "/v1/batches",
            json={
                "input_file_id": uploaded.json()["id"],
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
        )
        admin = {"Authorization": f"Bearer {admin_key}"}
        await client.post(f"/admin/requests/{ids[-1]}/cancel", headers=admin)
        guard = {"set": {"max_queue_depth": 500}}
        await client.patch("/admin/policy?model=mock", json=guard, headers=admin)
    return admin_key, ids[0]


async def _shoot(page: Page, url: str, path: Path, ready: str) -> None:
    await page.goto(url)
    await page.wait_for_selector(ready, timeout=15_000)
    await page.wait_for_timeout(1500)  # a poll or two: the figures move
    await page.screenshot(path=str(path), full_page=True)
    print(f"wrote {path}")


async def shots(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with EmbeddedRedis() as server:
        worker_stop = asyncio.Event()
        workers = [
            asyncio.create_task(
                serve(
                    WorkerSettings.model_validate(
                        {
                            **FAST_MODEL,
                            "redis_url": server.url,
                            "heartbeat_seconds": 0.2,
                            "concurrency": 4,
                            "model_tokens_per_second": 20.0,
                        }
                    ),
                    stop=worker_stop,
                )
            )
            for _ in range(2)
        ]
        settings = ApiSettings(redis_url=server.url, port=free_port())
        uv, task = start_uvicorn(create_app(settings), settings.port, lifespan="on")
        api = f"http://127.0.0.1:{settings.port}"
        try:
            await wait_until(lambda: uv.started, timeout=10, what="uvicorn to start")
            admin_key, running = await _scene(api, server.url)
            async with async_playwright() as driver:
                browser = await driver.chromium.launch(
                    executable_path=CHROMIUM, args=["--no-sandbox"]
                )
                page = await browser.new_page(viewport=LAPTOP)
                await page.goto(f"{api}/console/pool")
                await page.fill("#admin-key", admin_key)
                await page.click("#login button")
                pages = {
                    "pool": "#workers tbody tr",
                    "queue": "#requests tbody tr",
                    "tenants": "#tenants tbody tr",
                    "keys": "#keys tbody tr",
                    "batches": "#batches tbody tr",
                    "policy": "#policy-history tbody tr",
                    "audit": "#audit tbody tr",
                }
                for name, ready in pages.items():
                    await _shoot(page, f"{api}/console/{name}", out / f"{name}.png", ready)
                await _shoot(
                    page, f"{api}/console/requests/{running}", out / "request.png", "#record dd"
                )
                await page.set_viewport_size(PHONE)
                await _shoot(
                    page, f"{api}/console/pool", out / "pool-phone.png", "#workers tbody tr"
                )
                await browser.close()
        finally:
            uv.should_exit = True
            worker_stop.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.gather(task, *workers), 30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/console"))
    asyncio.run(shots(parser.parse_args().out))


if __name__ == "__main__":
    main()
