"""The pool policy (docs/policy.md): stored once in Redis, versioned and validated,
changed with ``llmq config``, followed by running API processes and workers within a
second, per model; claims run under one version."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import cast

import httpx
import pytest
from redis.asyncio import Redis

from llmq import registry
from llmq.connection import connect
from llmq.policy import store
from llmq.policy.derived import derive
from llmq.policy.live import LivePolicy, start
from llmq.policy.model import PolicyError
from llmq.protocol import keys
from llmq.protocol import policy as stored_policy
from llmq.protocol.queue import Queue
from llmq.schema import WorkerInfo
from llmq.settings import ApiSettings, CommonSettings, WorkerSettings
from tests.support.cluster import BOTH_BACKENDS
from tests.support.native import post_request, wait_ready, wait_status
from tests.support.processes import llmq
from tests.support.servers import StartApi, StartWorker
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

#: How soon every process follows a change.
FOLLOWED_SECONDS = 1.0


async def routing_beats(redis: Redis) -> int:
    """Workers whose load a routing beat published for ``mock``."""
    return int(await cast("Awaitable[int]", redis.hlen(keys.loads("mock"))))


async def hints(redis: Redis, model: str) -> int:
    """Queued requests of ``model`` with a route hint."""
    return int(await cast("Awaitable[int]", redis.hlen(keys.routes(model))))


def body(words: int, model: str = "mock") -> dict[str, object]:
    return {"model": model, "prompt": " ".join(["w"] * words), "max_tokens": 4}


async def test_a_change_reaches_a_running_api_and_worker_within_a_second_losing_nothing(
    redis_url: str, redis: Redis, start_api: StartApi, start_worker: StartWorker
) -> None:
    await start_worker()
    api = await start_api()
    async with api.client() as client:
        await wait_ready(client)
        statuses: list[int] = []
        stop = asyncio.Event()

        async def load() -> None:  # requests all through the change: none is lost
            while not stop.is_set():
                r = await client.post("/v1/completions", json=body(2))
                statuses.append(r.status_code)

        loader = asyncio.create_task(load())
        assert (await client.post("/v1/completions", json=body(6))).status_code == 200
        assert await routing_beats(redis) == 0  # fifo: no routing beat

        code, _, err = await llmq(
            redis_url, "config", "set", "max_prompt_tokens=5", "routing=least-loaded"
        )
        assert code == 0, err
        changed = time.monotonic()

        async def api_follows() -> bool:
            r = await client.post("/v1/completions", json=body(6))
            return r.status_code == 400 and "limit of 5" in r.text

        async def worker_follows() -> bool:  # a routed worker beats its load
            return bool(await routing_beats(redis))

        await wait_until(api_follows, timeout=FOLLOWED_SECONDS, what="the API to follow")
        await wait_until(worker_follows, timeout=FOLLOWED_SECONDS, what="the worker to follow")
        assert time.monotonic() - changed < FOLLOWED_SECONDS + 0.2
        stop.set()
        await loader
        assert statuses and set(statuses) == {200}, statuses


@BOTH_BACKENDS
async def test_two_models_on_one_redis_route_as_each_ones_policy_says(
    redis_url: str, redis: Redis, start_api: StartApi
) -> None:
    """No worker: the requests wait queued, with the route hint their model's routing
    writes (prefix: their blocks) or none (fifo)."""
    code, _, err = await llmq(redis_url, "config", "set", "routing=prefix", "--model", "chat")
    assert code == 0, err
    api = await start_api(accept_models="chat,batch", routing=None)
    async with api.client() as client:
        for model in ("chat", "batch"):
            r = await client.post("/v1/requests", json=body(40, model))
            assert r.status_code == 202, r.text
    assert await hints(redis, "chat") == 1
    assert await hints(redis, "batch") == 0
    chat, pool = await store.show(redis, "chat"), await store.show(redis, "batch")
    assert (chat.policy.routing, chat.source("routing")) == ("prefix", "model")
    assert (pool.policy.routing, pool.source("routing")) == ("fifo", "default")
    code, out, _ = await llmq(redis_url, "config", "show")
    assert code == 0 and out.splitlines()[-1] == "# models with overrides: chat", out


async def test_a_bad_value_is_refused_and_nothing_changes(redis_url: str, redis: Redis) -> None:
    assert (await llmq(redis_url, "config", "set", "max_queue_depth=50", "max_priority=10"))[0] == 0
    before = await stored_policy.read(redis)
    for args in (
        ["set", "routing=sideways"],
        ["set", "max_queue_depth=0"],
        ["set", "max_queue_depth=10", "no_such_setting=1"],
        ["set", "min_priority=5", "max_priority=1"],
        ["set", "--model", "m", "min_priority=2000"],
        ["set", "--model", "m", "min_priority=50"],  # valid alone, not over the pool's
        ["unset", "no_such_setting"],
    ):
        code, _, err = await llmq(redis_url, "config", *args)
        assert code == 2 and err.startswith(f"llmq config {args[0]}: "), (args, err)
    assert "routing" in (await llmq(redis_url, "config", "set", "routing=sideways"))[2]
    assert await stored_policy.read(redis) == before  # same version, same documents
    assert len(await store.history(redis)) == 1


async def test_a_policy_file_is_loaded_whole_or_refused_whole_at_its_line(
    redis_url: str, redis: Redis, tmp_path: Path
) -> None:
    good = tmp_path / "policy.toml"
    good.write_text('[pool]\nrouting = "prefix"\n\n[models.big]\nmax_queue_depth = 20\n')
    bad = tmp_path / "bad.toml"
    bad.write_text('[pool]\nrouting = "prefix"\n\n[models.big]\nmax_queue_depth = -1\n')
    code, out, _ = await llmq(redis_url, "config", "diff", str(good))
    assert code == 0 and 'pool routing: (unset) -> "prefix"' in out, out
    assert (await llmq(redis_url, "config", "load", str(good)))[0] == 0
    before = await stored_policy.read(redis)
    assert before.pool == {"routing": "prefix"} and before.models == {
        "big": {"max_queue_depth": 20}
    }
    code, _, err = await llmq(redis_url, "config", "load", str(bad))
    assert code == 2 and f"{bad}:4: [models.big] max_queue_depth:" in err, err
    unknown = tmp_path / "unknown.toml"
    unknown.write_text('[pool]\nrouting = "hash"\n\n[models.big]\nbogus = 1\n')
    code, _, err = await llmq(redis_url, "config", "load", str(unknown))
    assert code == 2 and f"{unknown}:4: [models.big] bogus: unknown setting" in err, err
    assert await stored_policy.read(redis) == before
    code, out, _ = await llmq(redis_url, "config", "diff", str(good))
    assert (code, out.strip()) == (0, "no change")


@BOTH_BACKENDS
async def test_concurrent_changes_are_all_kept(redis: Redis) -> None:
    names = ["max_queue_depth", "max_choices", "routing_window", "max_prompt_tokens"]
    await asyncio.gather(
        *(store.set_values(redis, {n: 7 + i}, None, f"op{i}") for i, n in enumerate(names))
    )
    found = await stored_policy.read(redis)
    assert found.pool == {n: 7 + i for i, n in enumerate(names)}
    assert found.version == len(names)
    assert sorted(c.who for c in await store.history(redis)) == [f"op{i}" for i in range(4)]


@BOTH_BACKENDS
async def test_a_claim_under_a_stale_version_is_refused_and_made_again_under_the_new(
    redis_url: str,
) -> None:
    """The claim script refuses a version below the model's floor; the queue reads the
    policy again (the version it holds moves only so) and claims under the new one."""
    redis = connect(CommonSettings(redis_url=redis_url))
    await store.set_values(redis, {"max_queue_depth": 5}, None, "op")
    live = LivePolicy(redis, live_ms=5000)
    await live.refresh()
    queue = Queue(redis, stream_maxlen=100, ttl_seconds=60, policy=live)
    await store.set_values(redis, {"fairness": "fifo"}, "mock", "op")  # floor of mock: 2
    assert int(await redis.get(keys.policy_version("mock"))) == 2
    assert live.version == 1  # no follower here: only a refused claim reads it again
    got = await queue.claim("mock", lease_ms=1000, in_progress_ms=1000, budget_left=None, idle=True)
    assert got.request_id is None and live.version == 2
    assert live.fairness_for("mock") == "fifo" and live.fairness_for("other") == "vtc"
    await redis.aclose(close_connection_pool=True)


async def test_the_first_process_seeds_the_policy_from_its_environment_once(
    redis: Redis, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="llmq.policy.live")
    monkeypatch.setenv("LLMQ_ROUTING", "prefix")
    first = await start(redis, ApiSettings(max_queue_depth=30), "api-1")
    assert first.version == 1 and first.of("m").routing == "prefix"
    assert first.of("m").max_queue_depth == 30
    assert any("seeded" in r.getMessage() for r in caplog.records)
    monkeypatch.setenv("LLMQ_ROUTING", "hash")
    later = await start(redis, WorkerSettings(max_queue_depth=5), "worker-1")
    assert later.version == 1 and later.of("m").routing == "prefix"
    ignored = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
    assert len(ignored) == 1 and "LLMQ_ROUTING, LLMQ_MAX_QUEUE_DEPTH" in ignored[0], ignored
    monkeypatch.setenv("LLMQ_ROUTING", "prefix")  # the pool's own values: nothing ignored
    await start(redis, WorkerSettings(max_queue_depth=30), "worker-2")
    assert len([r for r in caplog.records if "ignored" in r.getMessage()]) == 1
    history = await store.history(redis)
    assert [(c.version, c.who) for c in history] == [(1, "api-1")]
    assert json.loads(history[0].what)["seed"] == {"routing": "prefix", "max_queue_depth": 30}


async def test_of_processes_starting_together_on_a_new_pool_one_seeds(redis: Redis) -> None:
    starting = [ApiSettings(max_queue_depth=10 + i) for i in range(4)]
    started = await asyncio.gather(*(start(redis, s, f"api-{i}") for i, s in enumerate(starting)))
    assert {live.version for live in started} == {1}
    assert len({live.of("m").max_queue_depth for live in started}) == 1
    assert [c.version for c in await store.history(redis)] == [1]


async def test_derived_values_come_from_what_the_workers_declare(
    redis_url: str, redis: Redis
) -> None:
    info = WorkerInfo(
        id="w1",
        host="h",
        pid=1,
        model="llama",
        concurrency=4,
        running=0,
        started_at=0.0,
        heartbeat_at=0.0,
        tokenizer="chars",
        context_length=2048,
        prefix_cache=True,
        upstream={"engine": "vllm"},
    )
    await registry.heartbeat(redis, info, 10)
    tgi = {"id": "w2", "model": "tgi", "prefix_cache": False, "upstream": {"engine": "tgi"}}
    other = info.model_copy(update=tgi)
    await registry.heartbeat(redis, other, 10)
    found = await store.show(redis, "llama")
    assert found.policy.max_prompt_tokens == found.policy.max_tokens_limit == 2048
    assert found.policy.routing_tokenizer == "chars"
    assert {found.source(n) for n in ("max_prompt_tokens", "routing_tokenizer")} == {"derived"}
    assert (await store.show(redis, "mock")).source("max_prompt_tokens") == "default"
    await store.set_values(redis, {"max_prompt_tokens": 1000}, "llama", "op")  # overridden
    code, out, _ = await llmq(redis_url, "config", "show", "--model", "llama")
    assert code == 0
    shown = {line.split()[0]: line.split()[1:] for line in out.splitlines()[1:]}
    assert shown["max_prompt_tokens"] == ["1000", "model"]
    assert shown["max_tokens_limit"] == ["2048", "derived"]
    assert shown["routing"] == ['"prefix"', "derived"]  # vLLM keeps a prefix cache
    assert (await store.show(redis, "tgi")).policy.routing == "least-loaded"
    assert (await store.show(redis, "mock")).source("routing") == "default"
    live = LivePolicy(redis, live_ms=10_000, derived=True)
    await live.refresh()
    await live.derive()
    assert live.routing_for("llama").tokenizer.name == "chars"


async def test_a_pool_of_mocks_derives_prefix_routing_as_their_kv_cache_keeps_prefixes(
    redis_url: str, redis: Redis, start_api: StartApi, start_worker: StartWorker
) -> None:
    """Nothing set: the mock's engine keeps a prefix cache, as vLLM's, so its pool routes
    by prefix (the API's hints, the worker's claims and cache beats), as ``llmq config
    show`` says."""
    await start_worker(routing=None)
    api = await start_api(routing=None)
    async with api.client() as client:
        await wait_ready(client)
        (entry,) = await registry.live_workers(redis, 10)
        assert entry.prefix_cache is True

        async def prefix_routed() -> bool:
            return api.app_state().policy.routing_for("mock").policy.name == "prefix"

        await wait_until(prefix_routed, timeout=5, what="the API to derive prefix routing")

        async def worker_routes() -> bool:  # a worker beats its cache only when routed
            return bool(await cast("Awaitable[int]", redis.hlen(keys.loads("mock"))))

        await wait_until(worker_routes, timeout=5, what="the worker to claim by prefix")
        code, out, _ = await llmq(redis_url, "config", "show", "--model", "mock")
        assert code == 0
        shown = {line.split()[0]: line.split()[1:] for line in out.splitlines()[1:]}
        assert shown["routing"] == ['"prefix"', "derived"], out


def _worker(wid: str, **declared: object) -> WorkerInfo:
    fixed = {"host": "h", "pid": 1, "model": "m", "concurrency": 1, "running": 0}
    return WorkerInfo(id=wid, **fixed, started_at=0.0, heartbeat_at=0.0, **declared)


def test_workers_derive_prefix_routing_only_where_they_all_keep_a_prefix_cache() -> None:
    mock = _worker("mock", prefix_cache=True)
    plain = _worker("tgi", prefix_cache=False, upstream={"engine": "tgi"})
    vllm = _worker("vllm", prefix_cache=True, upstream={"engine": "vllm"})
    routing = {
        names: derive(workers)["m"].get("routing")
        for names, workers in {
            "mocks": [mock, mock],
            "mock+vllm": [mock, vllm],
            "mock+tgi": [mock, plain],
            "tgi": [plain],
        }.items()
    }
    assert routing == {
        "mocks": "prefix",
        "mock+vllm": "prefix",
        "mock+tgi": "least-loaded",
        "tgi": "least-loaded",
    }


def test_an_entry_that_predates_the_prefix_cache_declaration_is_judged_as_before() -> None:
    """Old workers' entries have no ``prefix_cache``: an upstream's by its engine, a
    mock's derives no routing (the default holds)."""
    fields = {"host": "h", "model": "m", "pid": 1, "concurrency": 1, "running": 0}
    old = {"id": "w", **fields, "started_at": 0.0, "heartbeat_at": 0.0}
    mock = WorkerInfo.model_validate_json(json.dumps(old))
    assert mock.prefix_cache is None
    vllm = WorkerInfo.model_validate_json(json.dumps({**old, "upstream": {"engine": "vllm"}}))
    tgi = WorkerInfo.model_validate_json(json.dumps({**old, "upstream": {"engine": "tgi"}}))
    assert "routing" not in derive([mock])["m"]
    assert derive([vllm])["m"]["routing"] == "prefix"
    assert derive([vllm, tgi])["m"]["routing"] == "least-loaded"


def test_a_policy_error_names_the_setting() -> None:
    with pytest.raises(PolicyError, match="routing"):
        from llmq.policy.model import parse_value

        parse_value("routing", "sideways")


async def test_the_api_answers_requests_of_an_unchanged_policy(
    start_api: StartApi, start_worker: StartWorker
) -> None:
    await start_worker()
    api = await start_api()
    async with httpx.AsyncClient(base_url=api.url, timeout=30) as client:
        await wait_ready(client)
        r = await client.post("/v1/completions", json=body(9000))
        assert r.status_code == 400 and "limit of 8192" in r.text


async def test_a_changed_default_tenant_takes_effect_live_without_a_restart(
    redis_url: str, start_api: StartApi
) -> None:
    """Requests that name no tenant belong to the pool policy's ``default_tenant``, as
    it is now: after the change, the new default's request rate applies."""
    code, _, err = await llmq(redis_url, "tenant", "create", "acme", "--requests-per-minute", "1")
    assert code == 0, err
    api = await start_api(accept_models="mock")
    async with api.client() as client:
        for _ in range(3):  # the built-in default tenant has no limits
            assert (await client.post("/v1/requests", json=body(2))).status_code == 202
        code, _, err = await llmq(redis_url, "config", "set", "default_tenant=acme")
        assert code == 0, err

        async def limited() -> bool:  # acme's one request a minute, then 429
            r = await client.post("/v1/requests", json=body(2))
            return r.status_code == 429

        await wait_until(limited, timeout=FOLLOWED_SECONDS * 2, what="the new default tenant")


async def test_changed_lifetimes_reach_a_running_api_and_worker_without_a_restart(
    redis_url: str, redis: Redis, start_api: StartApi, start_worker: StartWorker
) -> None:
    """``request_ttl_seconds`` is pool-wide and read at each write: after ``llmq config
    set``, a new request's record written by the API (a model no worker serves: only the
    API writes it) and a served request's stream written by the worker expire within the
    new value; a model's override of it is not read."""
    await store.set_values(redis, {"request_ttl_seconds": 7200}, "mock", "op")
    await store.set_values(redis, {"request_ttl_seconds": 7200}, "idle", "op")
    await start_worker()
    api = await start_api(accept_models="idle")
    async with api.client() as client:
        await wait_ready(client)
        served = await post_request(client, max_tokens=2)
        await wait_status(client, served, "done")
        waiting = (await client.post("/v1/requests", json=body(2, "idle"))).json()["id"]
        for key in (keys.stream(served), keys.request(waiting)):  # the pool's, not 7200
            assert 3000 < await redis.ttl(key) <= 3600, key

        code, _, err = await llmq(redis_url, "config", "set", "request_ttl_seconds=60")
        assert code == 0, err

        async def api_follows() -> bool:
            r = await client.post("/v1/requests", json=body(2, "idle"))
            return 0 < int(await redis.ttl(keys.request(r.json()["id"]))) <= 60

        async def worker_follows() -> bool:
            rid = await post_request(client, max_tokens=2)
            await wait_status(client, rid, "done")
            return 0 < int(await redis.ttl(keys.stream(rid))) <= 60

        await wait_until(api_follows, timeout=FOLLOWED_SECONDS * 2, what="the API's records")
        await wait_until(worker_follows, timeout=FOLLOWED_SECONDS * 2, what="the worker's streams")


async def test_lifetimes_in_the_environment_seed_a_new_pool(
    redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMQ_REQUEST_TTL_SECONDS", "120")
    monkeypatch.setenv("LLMQ_STREAM_MAXLEN", "64")
    monkeypatch.setenv("LLMQ_LIFECYCLE_MAXLEN", "500")
    live = await start(redis, WorkerSettings(), "worker-1")
    pool = live.pool()
    assert (pool.request_ttl_seconds, pool.stream_maxlen, pool.lifecycle_maxlen) == (120, 64, 500)
    assert (await stored_policy.read(redis)).pool == {
        "request_ttl_seconds": 120,
        "stream_maxlen": 64,
        "lifecycle_maxlen": 500,
    }
