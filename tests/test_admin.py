"""The admin API: refused without an admin key (nothing changed), every action in the
audit trail, its listings bounded, and a drained worker claiming nothing more."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from llmq import metrics
from llmq.admin import ADMIN_KEY_PREFIX, AUDIT_MAXLEN, audit, audit_trail, create_admin_key
from llmq.metrics import MINUTE_KEEP_SECONDS, minute_field
from llmq.policy import store
from llmq.protocol import keys
from llmq.tenants import Tenant, TenantStore, digest, key_id
from tests.support.native import post_request, wait_ready, wait_status
from tests.support.processes import llmq
from tests.support.servers import RunningApi, StartApi, StartWorker
from tests.support.waiting import wait_until
from tests.test_batch import chat_line, create, finished
from tests.test_policy import FOLLOWED_SECONDS, body, routing_beats

pytestmark = pytest.mark.timeout(90)

#: One call of every admin route: (method, path, body).
CALLS: list[tuple[str, str, dict[str, Any] | None]] = [
    ("GET", "/admin/pool", None),
    ("GET", "/admin/queue", None),
    ("GET", "/admin/requests", None),
    ("GET", "/admin/requests/r1", None),
    ("POST", "/admin/requests/r1/cancel", None),
    ("GET", "/admin/requests/r1/events", None),
    ("GET", "/admin/tenants", None),
    ("POST", "/admin/tenants", {"name": "new"}),
    ("GET", "/admin/keys", None),
    ("POST", "/admin/keys", {"tenant": "acme"}),
    ("DELETE", "/admin/keys/{key_id}", None),
    ("GET", "/admin/batches", None),
    ("POST", "/admin/batches/b1/cancel", None),
    ("GET", "/admin/batches/b1/output", None),
    ("POST", "/admin/workers/w1/drain", None),
    ("GET", "/admin/audit", None),
    ("GET", "/admin/policy", None),
    ("PATCH", "/admin/policy", {"set": {"max_queue_depth": 5}}),
    ("PUT", "/admin/policy?model=mock", {"unset": ["max_queue_depth"]}),
    ("GET", "/admin/policy/history", None),
]


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def assert_error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    error: dict[str, Any] = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


async def snapshot(redis: Redis) -> dict[str, Any]:
    """What an admin action could change: keys, tenants, drains, the audit trail."""
    return {
        "keys": await redis.hgetall(keys.API_KEYS),  # type: ignore[misc]
        "admin": await redis.hgetall(keys.ADMIN_KEYS),  # type: ignore[misc]
        "tenants": await redis.smembers(keys.TENANTS),  # type: ignore[misc]
        "drains": sorted(await redis.keys(keys.drain("*"))),
        "audit": await redis.xlen(keys.AUDIT),
        "policy": await redis.hgetall(keys.POLICY),  # type: ignore[misc]
        "policy_history": await redis.xlen(keys.POLICY_HISTORY),
    }


async def test_the_admin_api_refuses_no_key_a_wrong_key_and_a_tenants_key(
    start_api: StartApi, redis: Redis
) -> None:
    api = await start_api(tenant_keys=True, api_keys="static-key")
    store = TenantStore(redis)
    await store.put(Tenant(name="acme"))
    tenant_key = await store.create_key("acme")
    await create_admin_key(redis, "ops")
    key_id = (await store.keys())[0][0][:12]
    before = await snapshot(redis)
    async with api.client() as client:
        for method, path, body in CALLS:
            url = path.format(key_id=key_id)
            none = await client.request(method, url, json=body)
            assert_error(none, 401)
            assert none.headers["www-authenticate"] == "Bearer"
            assert_error(await client.request(method, url, json=body, headers=bearer("nope")), 401)
            for known in (tenant_key, "static-key"):
                r = await client.request(method, url, json=body, headers=bearer(known))
                assert assert_error(r, 403)["type"] == "permission_error", url
    assert await snapshot(redis) == before
    # and the tenant's key still works where it belongs
    async with api.client(headers=bearer(tenant_key)) as client:
        assert (await client.get("/v1/models")).status_code == 200


async def test_bad_filters_and_unknown_ids_are_refused_clearly_changing_nothing(
    stack: RunningApi, redis: Redis
) -> None:
    admin_key = await create_admin_key(redis, "ops")
    before = await snapshot(redis)
    async with stack.client(headers=bearer(admin_key)) as client:
        for query, param in [
            ("status=sleeping", "status"),
            ("limit=0", "limit"),
            ("limit=101", "limit"),
            ("tenant=no%20such", "tenant"),
            ("model=nosuch", "model"),
        ]:
            error = assert_error(await client.get(f"/admin/requests?{query}"), 400)
            assert error["param"] in (param, f"query.{param}"), error
        assert_error(await client.get("/admin/audit?before=x"), 400)
        assert_error(await client.get("/admin/audit?limit=501"), 400)
        assert_error(await client.get("/admin/batches?limit=0"), 400)
        assert_error(await client.post("/admin/tenants", json={"name": "a b"}), 400)
        assert_error(await client.post("/admin/keys", json={"tenant": "nosuch"}), 400)
        assert_error(await client.post("/admin/keys", json={}), 400)
        for method, path in [
            ("GET", "/admin/requests/nosuch"),
            ("GET", "/admin/requests/nosuch/events"),
            ("POST", "/admin/requests/nosuch/cancel"),
            ("POST", "/admin/batches/nosuch/cancel"),
            ("GET", "/admin/batches/nosuch/output"),
            ("POST", "/admin/workers/nosuch/drain"),
            ("DELETE", "/admin/keys/abcdef123456"),
        ]:
            assert_error(await client.request(method, path), 404)
    assert await snapshot(redis) == before


async def test_every_admin_action_is_in_the_audit_trail_with_who_did_it(
    start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    await start_worker(model_tokens_per_second=20.0)
    api = await start_api()
    admin_key = await create_admin_key(redis, "ops")
    async with api.client() as plain:
        await wait_ready(plain)
        rid = await post_request(plain, max_tokens=2000)
        await wait_status(plain, rid, "running")
        async with api.sdk() as sdk:
            batch = await create(sdk, [chat_line(f"l{i}", "hello", 500) for i in range(20)])
    async with api.client(headers=bearer(admin_key)) as client:
        worker_id = (await client.get("/admin/pool")).json()["workers"][0]["id"]
        made = await client.post("/admin/tenants", json={"name": "acme", "weight": 2.0})
        assert made.status_code == 201, made.text
        key = (await client.post("/admin/keys", json={"tenant": "acme"})).json()
        assert key["key"].startswith("sk-llmq-")
        assert (await client.delete(f"/admin/keys/{key['id']}")).status_code == 200
        assert (await client.post(f"/admin/requests/{rid}/cancel")).json()["cancelled"]
        assert (await client.post(f"/admin/batches/{batch.id}/cancel")).status_code == 200
        assert (await client.post(f"/admin/workers/{worker_id}/drain")).status_code == 200
        listed = (await client.get("/admin/audit")).json()["data"]
    expected = [
        ("worker.drain", worker_id),
        ("batch.cancel", batch.id),
        ("request.cancel", rid),
        ("key.revoke", key["id"]),
        ("key.create", key["id"]),
        ("tenant.create", "acme"),
    ]
    assert [(e["action"], e["target"]) for e in listed] == expected
    admin_id = next(d for d in await redis.hkeys(keys.ADMIN_KEYS))[:12]  # type: ignore[misc]
    assert {(e["who"], e["name"]) for e in listed} == {(admin_id, "ops")}
    assert all(key["key"] not in str(e) for e in listed), "a key in the audit trail"
    assert [e.id for e in await audit_trail(redis, 2, listed[1]["id"])] == [
        e["id"] for e in listed[2:4]
    ]


async def test_listings_are_bounded_with_a_queue_of_a_thousand(
    start_api: StartApi, redis: Redis
) -> None:
    api = await start_api(accept_models="mock", max_queue_depth=2000)
    admin_key = await create_admin_key(redis, "ops")
    async with api.client() as plain:
        gate = asyncio.Semaphore(16)

        async def one(i: int) -> str:
            async with gate:
                return await post_request(plain, f"p{i}", max_tokens=4)

        ids = await asyncio.gather(*(one(i) for i in range(1000)))
    async with api.client(headers=bearer(admin_key)) as client:
        page = (await client.get("/admin/requests?limit=100")).json()
        assert len(page["data"]) == 100 and page["has_more"]
        head = await redis.zrange(keys.queue("mock"), 0, 99)
        assert [r["id"] for r in page["data"]] == head  # in the order they will run
        assert all("prompt" not in r and "owner" not in r for r in page["data"])
        (queue,) = (await client.get("/admin/queue")).json()["models"]
        assert queue["depth"] == 1000 and queue["by_tenant"] == {"default": 1000}
        assert queue["by_priority"] == {"0": 1000}
        opened = (await client.get(f"/admin/requests/{ids[500]}")).json()
        assert opened["prompt"] == "p500"
        assert opened["position"] == await redis.zrank(keys.queue("mock"), ids[500])


async def test_a_drained_worker_finishes_its_runs_and_claims_nothing_more(
    start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    await start_worker(model_tokens_per_second=50.0)
    api = await start_api()
    admin_key = await create_admin_key(redis, "ops")
    async with api.client() as plain, api.client(headers=bearer(admin_key)) as client:
        await wait_ready(plain)
        running = await post_request(plain, max_tokens=40)
        await wait_status(plain, running, "running")
        worker_id = (await client.get("/admin/pool")).json()["workers"][0]["id"]
        assert (await client.post(f"/admin/workers/{worker_id}/drain")).status_code == 200

        async def drained() -> bool:
            (w,) = (await client.get("/admin/pool")).json()["workers"]
            return bool(w["draining"])

        await wait_until(drained, timeout=10, what="the worker to say it is drained")
        waiting = await post_request(plain, max_tokens=4)
        await wait_status(plain, running, "done", timeout=20)
        opened = (await client.get(f"/admin/requests/{running}")).json()
        events = [e["event"] for e in opened["lifecycle"]]
        assert events[:2] == ["queued", "started"] and events[-1] == "finished", events
        assert opened["lifecycle"][1]["worker"] == worker_id
        # ten heartbeats and many claim polls later, nothing took the new request
        await asyncio.sleep(2)
        assert (await plain.get(f"/v1/requests/{waiting}")).json()["status"] == "queued"
        await start_worker()
        await wait_status(plain, waiting, "done", timeout=20)


async def test_the_command_makes_an_admin_key_apart_from_every_tenants(
    redis_url: str, redis: Redis
) -> None:
    code, key, err = await llmq(redis_url, "key", "create", "--admin", "--name", "ops")
    key = key.strip()
    assert code == 0 and key.startswith(ADMIN_KEY_PREFIX) and "shown once" in err
    assert await redis.hget(keys.ADMIN_KEYS, digest(key)) is not None  # type: ignore[misc]
    assert await redis.hlen(keys.API_KEYS) == 0  # type: ignore[misc]
    assert key not in str(await redis.hgetall(keys.ADMIN_KEYS))  # type: ignore[misc]
    _, listed, _ = await llmq(redis_url, "key", "list")
    assert f"{key_id(digest(key))}  (admin ops)" in listed and key not in listed
    code, _, err = await llmq(redis_url, "key", "create", "--admin", "--tenant", "acme")
    assert code == 2 and "not allowed with" in err
    assert (await llmq(redis_url, "key", "revoke", key_id(digest(key))))[0] == 0
    assert await redis.hlen(keys.ADMIN_KEYS) == 0  # type: ignore[misc]


async def test_the_audit_trail_is_capped(redis: Redis) -> None:
    pipe = redis.pipeline(transaction=False)
    for i in range(AUDIT_MAXLEN + 1000):
        pipe.xadd(keys.AUDIT, {"data": "{}"})  # untrimmed: the next audit entry trims
        if i % 1000 == 999:
            await pipe.execute()
    await pipe.execute()
    await audit(redis, "0" * 32, "ops", "tenant.create", "acme")
    # approximate trimming drops whole nodes (100 entries each by default)
    assert AUDIT_MAXLEN <= await redis.xlen(keys.AUDIT) <= AUDIT_MAXLEN + 100
    (newest,) = await audit_trail(redis, 1)
    assert (newest.action, newest.target, newest.who) == ("tenant.create", "acme", "0" * 12)


async def test_the_consoles_pages_hold_no_data_and_forbid_framing(
    stack: RunningApi, redis: Redis
) -> None:
    store = TenantStore(redis)
    await store.put(Tenant(name="acme"))
    await store.create_key("acme")
    async with stack.client() as client:
        assert (await client.get("/console")).headers["location"] == "/console/pool"
        for page in ("pool", "queue", "tenants", "keys", "batches", "audit", "requests/r1"):
            r = await client.get(f"/console/{page}")
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
            assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
            assert "acme" not in r.text  # the pages are shells: the data comes from /admin/
        assert_error(await client.get("/console/nosuch"), 404)
        script = await client.get("/console/static/console.js")
        assert script.status_code == 200 and "sessionStorage" in script.text


async def test_a_tenants_usage_over_the_last_hour_is_kept_per_minute(
    start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    await start_worker()
    api = await start_api(tenant_keys=True)
    store = TenantStore(redis)
    await store.put(Tenant(name="acme", requests_per_minute=2))
    key = await store.create_key("acme")
    admin_key = await create_admin_key(redis, "ops")
    # An hour and a minute ago (dropped from the window) and 59 minutes ago (its first).
    now_minute = int(time.time()) // 60
    for ago, n in ((60, 7), (59, 5)):
        field = minute_field(metrics.TENANT_REQUESTS.name, ("acme", "shed"))
        await redis.hset(keys.metrics_minute(now_minute - ago), field, str(n))  # type: ignore[misc]
    async with api.client(headers=bearer(key)) as client:
        await wait_ready(client)
        body = {"model": "mock", "prompt": "p", "max_tokens": 3}
        answers = [await client.post("/v1/requests", json=body) for _ in range(5)]
        taken = [r.json()["id"] for r in answers if r.status_code == 202]
        refused = sum(r.status_code == 429 for r in answers)
        assert taken and refused == 5 - len(taken), [r.status_code for r in answers]
        for rid in taken:
            await wait_status(client, rid, "done")

    async def acme() -> dict[str, Any]:
        async with api.client(headers=bearer(admin_key)) as client:
            rows = (await client.get("/admin/tenants")).json()["data"]
        found: dict[str, Any] = next(t for t in rows if t["name"] == "acme")
        return found

    async def counted() -> bool:
        hour: dict[str, list[int]] = (await acme())["last_hour"]
        return sum(hour["accepted"]) == len(taken) and sum(hour["tokens"]) > 0

    await wait_until(counted, timeout=15, what="the minute's counts flushed")
    row = await acme()
    hour, usage = row["last_hour"], row["usage"]
    assert {k: len(v) for k, v in hour.items() if k != "start"} == dict.fromkeys(
        ("tokens", "accepted", "rate_limited", "shed"), 60
    )
    assert hour["start"] // 60 in (now_minute - 59, now_minute - 58)  # a minute may turn
    assert sum(hour["rate_limited"]) == refused == usage["rate_limited"]
    assert sum(hour["tokens"]) == usage["tokens"]
    assert hour["shed"][0] == (5 if hour["start"] // 60 == now_minute - 59 else 0)
    assert sum(hour["shed"]) <= 5, "a minute older than the hour was shown"
    flushed = [keys.metrics_minute(m) for m in (now_minute, now_minute + 1)]
    ttls = [await redis.ttl(k) for k in flushed if await redis.exists(k)]
    assert ttls and all(0 < t <= MINUTE_KEEP_SECONDS for t in ttls), ttls


async def test_a_bad_policy_value_is_refused_naming_the_key_changing_nothing(
    stack: RunningApi, redis: Redis
) -> None:
    admin_key = await create_admin_key(redis, "ops")
    async with stack.client(headers=bearer(admin_key)) as client:
        ok = await client.patch("/admin/policy", json={"set": {"max_priority": 10}})
        assert ok.status_code == 200, ok.text
        before = await snapshot(redis)
        for query, change, param in [
            ("", {"set": {"routing": "sideways"}}, "routing"),
            ("", {"set": {"max_queue_depth": 0}}, "max_queue_depth"),
            ("", {"set": {"max_queue_depth": 10, "no_such_setting": 1}}, "no_such_setting"),
            ("", {"set": {"min_priority": 5, "max_priority": 1}}, "min_priority"),
            ("?model=m", {"set": {"min_priority": 2000}}, "min_priority"),
            ("?model=m", {"set": {"min_priority": 50}}, "min_priority"),  # not over the pool's
            ("", {"unset": ["no_such_setting"]}, "no_such_setting"),
            ("", {}, "set"),
        ]:
            for method in ("PATCH", "PUT"):
                r = await client.request(method, "/admin/policy" + query, json=change)
                error = assert_error(r, 400)
                assert (error["param"], error["code"]) == (param, "invalid_value"), (change, error)
        error = assert_error(await client.patch("/admin/policy?model=a%20b", json={}), 400)
        assert error["param"] in ("model", "query.model"), error
        assert_error(await client.get("/admin/policy/history?limit=0"), 400)
        shown = (await client.get("/admin/policy")).json()
    assert await snapshot(redis) == before  # same version, documents, history, audit
    assert shown["pool"]["max_priority"] == {"value": 10, "source": "pool"}


async def test_a_policy_change_by_the_admin_api_is_followed_live_audited_and_in_its_history(
    redis_url: str, redis: Redis, start_api: StartApi, start_worker: StartWorker
) -> None:
    await start_worker()
    api = await start_api()
    admin_key = await create_admin_key(redis, "ops")
    async with api.client() as plain, api.client(headers=bearer(admin_key)) as admin:
        await wait_ready(plain)
        assert (await plain.post("/v1/completions", json=body(6))).status_code == 200
        assert await routing_beats(redis) == 0  # fifo: no routing beat
        change = {"set": {"max_prompt_tokens": 5, "routing": "least-loaded"}}
        made = await admin.patch("/admin/policy", json=change)
        assert made.status_code == 200, made.text
        changed = time.monotonic()

        async def api_follows() -> bool:
            r = await plain.post("/v1/completions", json=body(6))
            return r.status_code == 400 and "limit of 5" in r.text

        async def worker_follows() -> bool:  # a routed worker beats its load
            return bool(await routing_beats(redis))

        await wait_until(api_follows, timeout=FOLLOWED_SECONDS, what="the API to follow")
        await wait_until(worker_follows, timeout=FOLLOWED_SECONDS, what="the worker to follow")
        assert time.monotonic() - changed < FOLLOWED_SECONDS + 0.2
        model = await admin.put("/admin/policy?model=mock", json={"set": {"max_queue_depth": 7}})
        assert model.status_code == 200, model.text
        shown = (await admin.get("/admin/policy")).json()
        history = (await admin.get("/admin/policy/history?limit=2")).json()["data"]
        audited = (await admin.get("/admin/audit")).json()["data"]
    version = made.json()["version"]
    assert shown["version"] == model.json()["version"] == version + 1
    assert shown["pool"]["routing"] == {"value": "least-loaded", "source": "pool"}
    assert shown["models"]["mock"]["max_queue_depth"] == {"value": 7, "source": "model"}
    assert shown["models"]["mock"]["max_prompt_tokens"] == {"value": 5, "source": "pool"}
    assert shown["overridden"] == ["mock"]
    assert [(c["version"], c["who"]) for c in history] == [(version + 1, "ops"), (version, "ops")]
    assert json.loads(history[1]["what"]) == {"scope": "pool", **change}
    assert [(e["action"], e["target"], e["name"]) for e in audited] == [
        ("policy.change", "mock", "ops"),
        ("policy.change", "pool", "ops"),
    ]
    assert audited[1]["detail"]["set"] == change["set"]
    assert audited[1]["detail"]["version"] == version
    assert (await store.show(redis, "mock")).policy.max_queue_depth == 7
    code, out, _ = await llmq(redis_url, "config", "show", "--model", "mock")
    assert code == 0 and "max_queue_depth" in out and "model" in out, out


async def test_the_pool_shows_each_workers_pace_and_the_batches_their_rate(
    start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    """A routing worker's pace (how long a run holds a slot), as its beats publish it,
    and a batch's lines ended per minute between its start and its end."""
    await start_worker(routing="prefix", model_tokens_per_second=50.0)
    api = await start_api(routing="prefix")
    admin_key = await create_admin_key(redis, "ops")
    async with api.client() as plain, api.client(headers=bearer(admin_key)) as client:
        await wait_ready(plain)
        (w,) = (await client.get("/admin/pool")).json()["workers"]
        assert w["pace"] == {"service_ms": None, "block_us": None}  # nothing run yet
        async with api.sdk() as sdk:
            batch = await create(sdk, [chat_line(f"l{i}", "hello", 60) for i in range(6)])
            ended = (await finished(sdk, batch.id))[-1]
        assert ended.status == "completed", ended

        async def paced() -> bool:
            (w,) = (await client.get("/admin/pool")).json()["workers"]
            return bool(w["pace"]["service_ms"])

        await wait_until(paced, timeout=10, what="the worker's pace in the pool")
        (w,) = (await client.get("/admin/pool")).json()["workers"]
        assert 500 <= w["pace"]["service_ms"] <= 10_000, w["pace"]  # up to 60 tokens at 50/s
        (row,) = (await client.get("/admin/batches")).json()["data"]
        seconds = row["finalizing_at"] - row["in_progress_at"]
        assert seconds >= 1 and row["lines_per_minute"] == round(6 * 60 / seconds, 1), row
