"""Tenants and their keys: the ``llmq tenant``/``llmq key`` commands, auth by a tenant's
key, revocation on every API process, the trusted tenant header, the priority ceiling."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis

from llmq.protocol import keys
from llmq.protocol.streams import lifecycle_entries
from llmq.schema import Lifecycle
from llmq.tail import format_line
from llmq.tenants import (
    Tenant,
    TenantError,
    TenantLabels,
    TenantStore,
    digest,
    key_id,
    load_file,
)
from tests.support.native import post_request, wait_ready
from tests.support.processes import llmq
from tests.support.servers import RunningApi, StartApi, StartWorker
from tests.support.waiting import wait_until
from tests.test_batch import chat_line, finished, jsonl

pytestmark = pytest.mark.timeout(90)

BODY = {"model": "mock", "prompt": "hello", "max_tokens": 2}


async def field(redis: Redis, key: str, name: str) -> str | None:
    found: str | None = await redis.hget(key, name)  # type: ignore[misc]
    return found


@pytest.mark.slow
async def test_the_commands_manage_tenants_and_keys(
    redis_url: str, redis: Redis, tmp_path: Path
) -> None:
    assert (await llmq(redis_url, "tenant", "create", "acme", "--weight", "3"))[0] == 0
    code, _, err = await llmq(redis_url, "tenant", "create", "acme")
    assert code == 2 and "exists already" in err
    for bad, why in (
        (["--weight", "0"], "weight"),
        (["--tokens-per-minute", "-5"], "tokens_per_minute"),
        (["--weight", "nan"], "weight: Input should be a finite number"),
        (["--weight", "inf"], "weight: Input should be a finite number"),
    ):
        code, _, err = await llmq(redis_url, "tenant", "create", "other", *bad)
        assert code == 2 and why in err, err
    code, _, err = await llmq(redis_url, "tenant", "set", "nobody", "--weight", "2")
    assert code == 2 and "no tenant 'nobody'" in err
    code, _, err = await llmq(redis_url, "key", "create", "--tenant", "nobody")
    assert code == 2 and "no tenant 'nobody'" in err
    code, _, _ = await llmq(redis_url, "tenant", "set", "acme", "--requests-per-minute", "9")
    assert code == 0
    code, key, _ = await llmq(redis_url, "key", "create", "--tenant", "acme")
    key = key.strip()
    assert code == 0 and key.startswith("sk-llmq-")
    assert await field(redis, keys.API_KEYS, digest(key)) is not None
    assert key not in str(await redis.hgetall(keys.API_KEYS))  # type: ignore[misc]  # only its digest is stored
    _, listed, _ = await llmq(redis_url, "key", "list")
    assert key_id(digest(key)) in listed and key not in listed
    _, tenants, _ = await llmq(redis_url, "tenant", "list")
    assert "acme  3  -  9" in tenants
    assert (await llmq(redis_url, "key", "revoke", key_id(digest(key))))[0] == 0
    assert await field(redis, keys.API_KEYS, digest(key)) is None
    code, _, err = await llmq(redis_url, "key", "revoke", key_id(digest(key)))
    assert code == 2 and "no key matches" in err
    wrong = tmp_path / "tenants.toml"
    wrong.write_text("[tenant.acme]\nweight = 2\n")
    code, out, err = await llmq(redis_url, "tenant", "load", str(wrong))
    assert code == 2 and "[tenant]: unknown table" in err and not out, err
    assert (await llmq(redis_url, "tenant", "delete", "acme"))[0] == 0
    assert await TenantStore(redis).names() == []


async def test_a_tenants_file_is_loaded_at_start(
    tmp_path: Path, redis: Redis, start_api: StartApi, start_worker: StartWorker
) -> None:
    path = tmp_path / "tenants.toml"
    listed = f'key_digests = ["{digest("sk-a")}"]'
    path.write_text(f"[tenants.team-a]\nweight = 2\nrequests_per_minute = 60\n{listed}\n")
    await start_worker()
    api = await start_api(tenant_keys=True, tenants_file=str(path))
    async with api.client(headers={"Authorization": "Bearer sk-a"}) as client:
        await wait_ready(client)
        created = await client.post("/v1/requests", json=BODY)
    assert created.status_code == 202
    assert await field(redis, keys.request(created.json()["id"]), "tenant") == "team-a"
    assert (await TenantStore(redis).get("team-a")) == Tenant(
        name="team-a", weight=2, requests_per_minute=60
    )


GOOD = "[tenants.good]\nweight = 2\n\n"
TAKEN = digest("sk-acme")

#: A tenants file that must be refused whole, after a valid table, and what the error says.
WRONG_FILES = {
    "digest-not-hex": (
        GOOD + f'[tenants.b]\nkey_digests = ["{"z" * 32}"]\n',
        ":4: [tenants.b] key_digests.0: 'zzzz",
    ),
    "digest-too-short": (
        GOOD + '[tenants.b]\nkey_digests = ["5e884898"]\n',
        "'5e884898' is not a key digest",
    ),
    "digest-under-two": (
        GOOD + f'[tenants.b]\nkey_digests = ["{digest("sk-b")}"]\n\n'
        f'[tenants.c]\nkey_digests = ["{digest("sk-b")}"]\n',
        f":7: [tenants.c] key_digests: {digest('sk-b')} is listed under [tenants.b] too",
    ),
    "digest-moves-a-key": (
        GOOD + f'[tenants.b]\nkey_digests = ["{TAKEN}"]\n',
        f":4: [tenants.b] key_digests: {TAKEN} is a key of tenant 'acme'",
    ),
    "misspelled-table": (
        GOOD.replace("tenants", "tenant"),
        ":1: [tenant]: unknown table",
    ),
    "misspelled-field": (
        GOOD + "[tenants.b]\nwieght = 2\n",
        ":4: [tenants.b] wieght: unknown field",
    ),
    "weight-a-string": (
        GOOD + '[tenants.b]\nweight = "2"\n',
        ":4: [tenants.b] weight: Input should be a valid number",
    ),
    "weight-nan": (
        GOOD + "[tenants.b]\nweight = nan\n",
        ":4: [tenants.b] weight: Input should be a finite number",
    ),
}


@pytest.mark.parametrize("case", list(WRONG_FILES))
async def test_a_wrong_tenants_file_is_refused_whole(
    case: str, tmp_path: Path, redis: Redis
) -> None:
    """A tenants file is held to what the commands accept, and a key to one tenant: a
    file with anything wrong writes nothing, and its error names the line, the table
    and the field."""
    store = TenantStore(redis)
    await store.put(Tenant(name="acme"))
    await store.add_key("acme", TAKEN)
    before = (await store.all(), await store.keys())
    content, message = WRONG_FILES[case]
    path = tmp_path / "tenants.toml"
    path.write_text(content)
    with pytest.raises(TenantError) as refused:
        await load_file(store, path)
    assert str(refused.value).startswith(str(path)) and message in str(refused.value)
    assert (await store.all(), await store.keys()) == before
    path.write_text(GOOD)  # the same store takes a right file
    assert await load_file(store, path) == 1


async def test_a_fresh_process_labels_its_first_concurrent_requests_by_tenant(
    redis: Redis,
) -> None:
    """Requests that arrive together in a fresh process wait for its first read of the
    tenants' names: each is counted under its tenant, none under ``other``."""
    names = [f"team-{i}" for i in range(8)]
    store = TenantStore(redis)
    for name in names:
        await store.put(Tenant(name=name))
    labels = TenantLabels(redis)
    assert await asyncio.gather(*(labels.label(n) for n in names)) == names
    assert await labels.label("unknown") == "other"


@pytest.fixture
async def tenants(start_api: StartApi, start_worker: StartWorker, redis: Redis) -> RunningApi:
    store = TenantStore(redis)
    await store.put(Tenant(name="acme", min_priority=0))
    await start_worker()
    api = await start_api(tenant_keys=True, api_keys="sk-static")
    async with api.client(headers={"Authorization": "Bearer sk-static"}) as client:
        await wait_ready(client)
    return api


async def test_a_key_is_its_tenants_until_revoked(tenants: RunningApi, redis: Redis) -> None:
    store = TenantStore(redis)
    key = await store.create_key("acme")
    async with (
        tenants.client(headers={"Authorization": f"Bearer {key}"}) as acme,
        tenants.client(headers={"Authorization": "Bearer sk-static"}) as static,
        tenants.client(headers={"Authorization": "Bearer sk-llmq-unknown"}) as unknown,
    ):
        mine = await acme.post("/v1/requests", json=BODY)
        default = await static.post("/v1/requests", json=BODY)
        refused = await unknown.post("/v1/requests", json=BODY)
        assert mine.status_code == 202 and default.status_code == 202
        assert await field(redis, keys.request(mine.json()["id"]), "tenant") == "acme"
        assert await field(redis, keys.request(default.json()["id"]), "tenant") == "default"
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "invalid_api_key"
        urgent = await acme.post("/v1/requests", json={**BODY, "priority": -1})
        assert urgent.status_code == 400
        assert urgent.json()["error"]["param"] == "priority"
        assert urgent.json()["error"]["code"] == "priority_not_allowed"
        await store.revoke(key_id(digest(key)))

        async def refused_now() -> bool:
            return (await acme.post("/v1/requests", json=BODY)).status_code == 401

        await wait_until(refused_now, timeout=10, what="the revoked key refused")


#: How each streaming API is opened, and the line its stream ends with when the key is
#: revoked: OpenAI's error chunk then ``[DONE]``, the Responses API's ``error`` event,
#: the native stream's ``error`` event.
STREAMS = ("completions", "responses", "native")


async def open_stream(client: httpx.AsyncClient, api: str) -> httpx.Request:
    if api == "completions":
        body = {"model": "mock", "prompt": "long", "max_tokens": 2000, "stream": True}
        return client.build_request("POST", "/v1/completions", json=body)
    if api == "responses":
        body = {"model": "mock", "input": "long", "max_output_tokens": 2000, "stream": True}
        return client.build_request("POST", "/v1/responses", json=body)
    rid = await post_request(client, "long", max_tokens=2000)
    return client.build_request("GET", f"/v1/requests/{rid}/events")


@pytest.mark.parametrize("api", STREAMS)
async def test_a_revoked_key_ends_its_stream(
    api: str, start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    store = TenantStore(redis)
    await store.put(Tenant(name="acme"))
    key = await store.create_key("acme")
    await start_worker(model_tokens_per_second=20)
    server = await start_api(tenant_keys=True)
    async with server.client(headers={"Authorization": f"Bearer {key}"}) as client:
        await wait_ready(client)
        response = await client.send(await open_stream(client, api), stream=True)
        try:
            assert response.status_code == 200
            lines = response.aiter_lines()
            first_token = {
                "completions": "data: {",
                "responses": "event: response.output_text.delta",
                "native": "event: tokens",
            }[api]
            async for line in lines:
                if line.startswith(first_token):
                    break
            await store.revoke(key_id(digest(key)))
            async with asyncio.timeout(30):  # unrevoked, it would run 100 s
                rest = [line async for line in lines if line.startswith("data: ")]
        finally:
            await response.aclose()
        ended = rest[-2] if api == "completions" else rest[-1]
        assert "invalid_api_key" in ended and "the API key was revoked" in ended, rest[-3:]
        if api == "completions":
            assert rest[-1] == "data: [DONE]"
        assert len(rest) < 100
        body = {"model": "mock", "prompt": "x", "max_tokens": 2}
        assert (await client.post("/v1/completions", json=body)).status_code == 401

    async def cancelled() -> bool:
        return int(await redis.zcard(keys.running("mock"))) == 0

    await wait_until(cancelled, timeout=10, what="the revoked key's request stopped")


async def test_the_trusted_header_names_the_tenant(
    start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    await TenantStore(redis).put(Tenant(name="team-b"))
    await start_worker()
    api = await start_api(tenant_header="X-Tenant")
    async with api.client() as client:
        await wait_ready(client)
        named = await client.post("/v1/requests", json=BODY, headers={"X-Tenant": "team-b"})
        unnamed = await client.post("/v1/requests", json=BODY)
        unknown = await client.post("/v1/requests", json=BODY, headers={"X-Tenant": "nobody"})
    assert await field(redis, keys.request(named.json()["id"]), "tenant") == "team-b"
    assert await field(redis, keys.request(unnamed.json()["id"]), "tenant") == "default"
    assert unknown.status_code == 401
    assert unknown.json()["error"]["code"] == "invalid_tenant"
    assert "nobody" in unknown.json()["error"]["message"]


@pytest.mark.slow
async def test_a_batch_is_its_creators_tenants_and_paced_by_its_quota(
    start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    store = TenantStore(redis)
    await store.put(Tenant(name="acme", requests_per_minute=120))  # a burst of 12, 2 a second
    key = await store.create_key("acme")
    await start_worker(concurrency=8)
    api = await start_api(tenant_keys=True)
    lines = [chat_line(f"line-{i}", f"question {i}") for i in range(20)]
    async with api.client(headers={"Authorization": f"Bearer {key}"}) as client:
        await wait_ready(client)
    async with api.sdk(api_key=key) as sdk:
        uploaded = await sdk.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
        batch = await sdk.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        done = (await finished(sdk, batch.id))[-1]
    assert done.status == "completed" and done.request_counts.completed == 20
    stored = await field(redis, keys.batch(batch.id), "meta")
    assert stored is not None and '"tenant":"acme"' in stored
    assert "tenant" not in done.model_dump()  # not OpenAI's field

    async def counted() -> dict[str, float]:
        raw = await redis.hgetall(keys.metric("llmq_tenant_requests"))  # type: ignore[misc]
        return {k: float(v) for k, v in raw.items()}

    async def all_counted() -> bool:
        return (await counted()).get('["", "acme", "accepted"]', 0) >= 20

    await wait_until(all_counted, timeout=10, what="the lines counted for acme")
    assert (await counted()).get('["", "acme", "rate_limited"]', 0) >= 1  # paced, retried


async def test_the_lifecycle_stream_and_llmq_tail_carry_the_tenant(
    start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    await TenantStore(redis).put(Tenant(name="team-c"))
    await start_worker()
    api = await start_api(tenant_header="X-Tenant")
    async with api.client() as client:
        await wait_ready(client)
        done = await client.post("/v1/completions", json=BODY, headers={"X-Tenant": "team-c"})
    rid = done.json()["id"].removeprefix("cmpl-")

    async def noted() -> list[Lifecycle]:
        entries = await lifecycle_entries(redis)
        found = [Lifecycle.model_validate_json(f["data"]) for _, f in entries]
        return [n for n in found if n.request_id == rid]

    async def finished_noted() -> bool:
        return "finished" in {n.event for n in await noted()}

    await wait_until(finished_noted, timeout=10, what="the finished note")
    notes = await noted()
    assert {n.event for n in notes} >= {"queued", "started", "finished"}
    assert {n.tenant for n in notes} == {"team-c"}
    assert "tenant=team-c" in format_line(notes[0])
