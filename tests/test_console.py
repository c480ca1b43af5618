"""The console in a real browser (headless Chromium, Debian's, driven by Playwright)
against a real pool: what it shows arrives live, what it does takes effect, and its
views stay bounded.

Skipped with its reason where Chromium is missing, except under CI (``CI`` set),
where a missing browser fails the run.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, Page, async_playwright, expect
from redis.asyncio import Redis

from api.routes.console import ROWS_SHOWN, TOKENS_SHOWN
from llmq.admin import create_admin_key
from llmq.policy import store
from llmq.tenants import Tenant, TenantStore, digest, key_id
from tests.support.native import post_request, wait_ready, wait_status
from tests.support.processes import llmq
from tests.support.servers import RunningApi, StartApi, StartWorker
from tests.support.waiting import wait_until
from tests.test_batch import chat_line, create

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]

CHROMIUM = "/usr/bin/chromium"

#: How long the page may take to show a change (it polls every second).
SHOWN_MS = 15_000


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    if not Path(CHROMIUM).exists():
        why = f"no Chromium at {CHROMIUM} (Debian package chromium: scripts/system-deps.sh)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    async with async_playwright() as driver:
        launched = await driver.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        await launched.close()


async def console(browser: Browser, api: RunningApi, redis: Redis, path: str) -> Page:
    """A tab on ``path`` with an admin key entered, as an operator would."""
    page = await browser.new_page()
    await page.goto(api.url + path)
    await page.fill("#admin-key", await create_admin_key(redis, "ops"))
    await page.click("#login button")
    await expect(page.locator("#content")).to_be_visible()
    return page


async def test_the_pool_page_shows_the_workers_that_are_up(
    browser: Browser, start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    first = await start_worker()
    await start_worker()
    api = await start_api()
    page = await console(browser, api, redis, "/console/pool")
    workers = page.locator("#workers tbody tr")
    await expect(workers).to_have_count(2, timeout=SHOWN_MS)
    await expect(page.locator("#models tbody tr[data-model=mock]")).to_contain_text("2")
    await first.close()
    await expect(workers).to_have_count(1, timeout=SHOWN_MS)


async def test_a_clients_request_appears_its_tokens_arrive_live_and_cancel_ends_its_stream(
    browser: Browser, start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    await start_worker(model_tokens_per_second=20.0)
    api = await start_api()
    async with api.client() as plain:
        await wait_ready(plain)
    chunks: list[Any] = []

    async def client() -> None:
        async with api.sdk() as sdk:
            stream = await sdk.chat.completions.create(
                model="mock",
                messages=[{"role": "user", "content": "tell me everything"}],
                max_tokens=2000,
                stream=True,
            )
            async for chunk in stream:
                chunks.append(chunk)

    streaming = asyncio.create_task(client())
    page = await console(browser, api, redis, "/console/queue")
    running = page.locator("#requests tbody tr[data-status=running] a")
    await expect(running).to_have_count(1, timeout=SHOWN_MS)
    await running.click()
    await expect(page.locator("#stream-state")).to_have_text("streaming", timeout=SHOWN_MS)
    shown = page.locator("#tokens")
    first = len(await shown.text_content() or "")
    await expect(shown).not_to_have_text(re.compile(rf"^[\s\S]{{0,{first}}}$"), timeout=SHOWN_MS)
    assert not streaming.done(), "the client's stream ended before the cancel"
    await page.click("#cancel")
    async with asyncio.timeout(10):
        await streaming
    assert len(chunks) < 1000, "the stream ran on after the cancel"
    await expect(page.locator("#stream-state")).to_have_attribute(
        "data-ended", "cancelled", timeout=SHOWN_MS
    )
    await expect(page.locator("dd[data-field=status]")).to_have_text("cancelled", timeout=SHOWN_MS)
    events = page.locator("#lifecycle tbody tr")
    await expect(events.first).to_have_attribute("data-event", "queued")
    await expect(events.last).to_have_attribute("data-event", "cancelled", timeout=SHOWN_MS)


async def test_a_key_revoked_from_the_console_gets_401_and_a_new_key_is_shown_once(
    browser: Browser, start_api: StartApi, redis: Redis
) -> None:
    api = await start_api(tenant_keys=True)
    store = TenantStore(redis)
    await store.put(Tenant(name="acme"))
    key = await store.create_key("acme")
    headers = {"Authorization": f"Bearer {key}"}
    async with api.client(headers=headers) as client:
        assert (await client.get("/v1/models")).status_code == 200
        page = await console(browser, api, redis, "/console/keys")
        row = page.locator(f"#keys tbody tr[data-key='{key_id(digest(key))}']")
        await row.get_by_role("button", name="Revoke").click()
        await expect(row).to_have_count(0, timeout=SHOWN_MS)

        async def refused() -> bool:
            return (await client.get("/v1/models")).status_code == 401

        await wait_until(refused, timeout=5, what="the revoked key to be refused")
    await page.fill("#new-key input[name=tenant]", "acme")
    await page.click("#new-key button")
    made = page.locator("#new-key-value")
    await expect(made).to_have_text(re.compile(r"^sk-llmq-"), timeout=SHOWN_MS)
    new_key = await made.text_content() or ""
    await page.click("#new-key-done")
    assert new_key not in await page.content()
    await page.reload()
    await expect(page.locator("#keys tbody tr")).to_have_count(2, timeout=SHOWN_MS)
    assert new_key not in await page.content()


async def test_a_batchs_progress_moves_and_its_cancel_from_the_console_works(
    browser: Browser, start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    await start_worker(model_tokens_per_second=100.0, concurrency=2)
    api = await start_api()
    async with api.sdk() as sdk:
        batch = await create(sdk, [chat_line(f"l{i}", "hello", 20) for i in range(200)])
    page = await console(browser, api, redis, "/console/batches")
    progress = page.locator(f"[data-progress='{batch.id}']")
    await expect(progress).not_to_have_text(re.compile(r"^\s*0 / 200$"), timeout=SHOWN_MS)
    seen = await progress.text_content() or ""
    await expect(progress).not_to_have_text(seen, timeout=SHOWN_MS)
    rate = page.locator(f"[data-rate='{batch.id}']")  # lines per minute
    await expect(rate).to_have_text(re.compile(r"^[1-9]\d*(\.\d)?$"), timeout=SHOWN_MS)
    row = page.locator(f"#batches tbody tr[data-batch='{batch.id}']")
    await row.get_by_role("button", name="Cancel").click()
    await expect(row).to_have_attribute("data-status", "cancelled", timeout=SHOWN_MS)
    async with api.sdk() as sdk:
        ended = await sdk.batches.retrieve(batch.id)
    assert ended.status == "cancelled"
    assert ended.request_counts is not None and 0 < ended.request_counts.completed < 200
    async with page.expect_download() as saving:
        await row.get_by_role("button", name="Output").click()
    saved = await (await saving.value).path()
    lines = [json.loads(line) for line in saved.read_text().splitlines()]
    assert len(lines) == ended.request_counts.completed
    assert {line["custom_id"] for line in lines} <= {f"l{i}" for i in range(200)}


async def test_a_tenants_throttled_count_rises_under_a_flood(
    browser: Browser, start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    await start_worker()
    api = await start_api(tenant_keys=True)
    store = TenantStore(redis)
    await store.put(Tenant(name="acme", requests_per_minute=2))
    key = await store.create_key("acme")
    page = await console(browser, api, redis, "/console/tenants")
    throttled = page.locator("[data-throttled=acme]")
    await expect(throttled).to_have_text("0", timeout=SHOWN_MS)
    async with api.client(headers={"Authorization": f"Bearer {key}"}) as client:
        await wait_ready(client)
        answers = [await client.post("/v1/requests", json=_small()) for _ in range(10)]
    refused = sum(r.status_code == 429 for r in answers)
    assert refused >= 8, [r.status_code for r in answers]
    await expect(throttled).to_have_text(str(refused), timeout=SHOWN_MS)
    # and in the last hour's, beside its requests per minute, the refused part in red
    await expect(page.locator("[data-hour-throttled=acme]")).to_have_text(str(refused))
    await expect(page.locator("tr[data-tenant=acme] svg.spark rect.refused").first).to_be_attached(
        timeout=SHOWN_MS
    )


def _small() -> dict[str, Any]:
    return {"model": "mock", "prompt": "p", "max_tokens": 2}


async def test_the_live_views_are_bounded_a_long_request_and_a_long_queue(
    browser: Browser, start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    api = await start_api(accept_models="mock", max_queue_depth=2000, max_tokens_limit=10_000)
    async with api.client() as plain:
        gate = asyncio.Semaphore(16)

        async def one(i: int) -> str:
            async with gate:
                return await post_request(plain, f"secret-prompt-{i}", max_tokens=4)

        await asyncio.gather(*(one(i) for i in range(1000)))
        page = await console(browser, api, redis, "/console/queue")
        await expect(page.locator("#requests tbody tr")).to_have_count(ROWS_SHOWN, timeout=SHOWN_MS)
        await expect(page.locator("#requests-more")).to_have_text(
            f"{1000 - ROWS_SHOWN} more not shown", timeout=SHOWN_MS
        )
        assert "secret-prompt" not in await page.content()
        await start_worker(model_tokens_per_second=4000.0)
        long = await post_request(plain, "the long one", max_tokens=10_000, priority=-100)
        await page.goto(f"{api.url}/console/requests/{long}")
        await wait_status(plain, long, "done", timeout=60)
        await expect(page.locator("#stream-state")).to_have_attribute(
            "data-ended", "length", timeout=SHOWN_MS
        )
    await expect(page.locator("#tokens-more")).to_have_text(
        f"{10_000 - TOKENS_SHOWN} earlier tokens not shown"
    )


async def test_routing_and_a_guard_changed_from_the_console_and_a_bad_value_refused(
    browser: Browser, stack: RunningApi, redis_url: str, redis: Redis
) -> None:
    page = await console(browser, stack, redis, "/console/policy")
    routing = page.locator("#policy tbody [data-key=routing][data-scope=pool]")
    await expect(routing).to_contain_text('"fifo"', timeout=SHOWN_MS)
    await page.select_option("#policy-key", "routing")
    await page.fill("#policy-value", "prefix")
    await page.click("#policy-change button[type=submit]")
    await expect(routing).to_contain_text('"prefix"pool', timeout=SHOWN_MS)
    await expect(page.locator("#policy-scope option[value=mock]")).to_have_count(1)
    await page.select_option("#policy-scope", "mock")
    await page.select_option("#policy-key", "max_queue_depth")
    await page.fill("#policy-value", "17")
    await page.click("#policy-change button[type=submit]")
    guard = page.locator("#policy tbody [data-key=max_queue_depth][data-scope=mock]")
    await expect(guard).to_contain_text("17model", timeout=SHOWN_MS)
    assert (await store.show(redis, "mock")).policy.max_queue_depth == 17
    code, out, _ = await llmq(redis_url, "config", "show")
    assert code == 0 and re.search(r"^routing\s+\"prefix\"\s+pool$", out, re.M), out
    newest = page.locator("#policy-history tbody tr").first
    await expect(newest).to_contain_text('"max_queue_depth": 17', timeout=SHOWN_MS)
    await expect(newest).to_contain_text("ops")
    before = await store.show(redis, "mock")
    await page.fill("#policy-value", "-3")
    await page.click("#policy-change button[type=submit]")
    refused = page.locator("#policy-refused")
    await expect(refused).to_be_visible(timeout=SHOWN_MS)
    await expect(refused).to_contain_text("max_queue_depth")
    assert await store.show(redis, "mock") == before
    await expect(guard).to_contain_text("17model")
