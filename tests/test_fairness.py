"""Fair share in the queue (``LLMQ_FAIRNESS=vtc``): within a priority band a claim serves
the backlogged tenant with the least weighted service, a tenant that was idle banks
only what the others were served of late, and a lone tenant gets every claim. Tested on
the claim script against Redis."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from llmq.protocol import keys
from llmq.protocol.codec import fair_entry
from llmq.protocol.queue import BATCH_BAND_MS, BATCH_FAIR_PRIORITY, Enqueue, Queue
from llmq.protocol.routing import routing_from
from llmq.protocol.scripts import scripts_for
from llmq.schema import JobPayload, SamplingParams
from llmq.settings import CommonSettings
from llmq.tenants import Tenant, TenantStore
from tests.support.jobs import claim_with, enqueue_costing
from tests.support.native import wait_ready, wait_status
from tests.support.processes import llmq
from tests.support.servers import RunningApi, StartApi, StartWorker
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

COST = 100


@pytest.fixture
async def queue(redis: Redis) -> Queue:
    return Queue(redis, stream_maxlen=100, ttl_seconds=60, fairness="vtc")


async def backlog(queue: Queue, tenant: str, n: int, *, weight: float = 1, start: int = 1,
                  priority: int = 0, cost: int = COST) -> None:  # fmt: skip
    for i in range(n):
        await enqueue_costing(
            queue,
            f"{tenant}-{i}",
            cost=cost,
            score=start + i,
            fair=fair_entry(tenant, weight, priority),
        )


async def claims(queue: Queue, n: int) -> list[str]:
    out = []
    for _ in range(n):
        claim = await claim_with(queue, budget_left=None, idle=True)
        assert claim.request_id is not None
        out.append(claim.request_id.rsplit("-", 1)[0])
    return out


async def test_a_light_tenant_is_served_in_turn_behind_a_noisy_one(queue: Queue) -> None:
    await backlog(queue, "noisy", 20)
    await backlog(queue, "light", 3, start=100)  # queued behind all of noisy's
    assert await claims(queue, 6) == ["noisy", "light", "noisy", "light", "noisy", "light"]


async def test_weights_share_the_claims(queue: Queue) -> None:
    await backlog(queue, "big", 40, weight=3)
    await backlog(queue, "small", 40, weight=1, start=1000)
    served = await claims(queue, 40)
    assert abs(served.count("big") - 30) <= 1, served


async def test_an_idle_tenant_banks_only_what_the_others_got_of_late(queue: Queue) -> None:
    """Early was served ten requests alone; late, idle till now, is credited what early
    got of late (ten requests' tokens, the least a backlogged tenant was served), not
    its whole idle time: ten turns in a row, then turns in turn."""
    await backlog(queue, "early", 30)
    assert await claims(queue, 10) == ["early"] * 10  # alone: every claim (work-conserving)
    await backlog(queue, "late", 20, start=1000)
    assert await claims(queue, 14) == ["late"] * 10 + ["early", "late"] * 2


async def test_an_idle_tenant_banks_nothing_older_than_its_recent_window(
    queue: Queue, redis: Redis
) -> None:
    """Early's service is older than the recent window (``RECENT_MS`` in ``fair.lua``,
    here by dropping what it counted): late, idle till now, is lifted to the floor and
    gets turns, not ten in a row."""
    await backlog(queue, "early", 30)
    assert await claims(queue, 10) == ["early"] * 10
    await redis.hdel(keys.vtc("mock"), "r:early")  # type: ignore[misc]
    await backlog(queue, "late", 10, start=1000)
    served = await claims(queue, 10)
    assert 4 <= served.count("late") <= 6, served


async def test_priority_bands_come_first(queue: Queue) -> None:
    await backlog(queue, "noisy", 5, priority=0)
    await backlog(queue, "light", 2, start=100, priority=5)  # a later band
    assert await claims(queue, 3) == ["noisy", "noisy", "noisy"]


async def test_a_request_without_a_tenant_keeps_its_place(queue: Queue, redis: Redis) -> None:
    await enqueue_costing(queue, "anon-0", cost=COST, score=1)
    await backlog(queue, "t", 2, start=2)
    assert await claims(queue, 3) == ["anon", "t", "t"]
    entries = await redis.hkeys(keys.fair("mock"))  # type: ignore[misc]
    assert sorted(entries) == ["charged:t-0", "charged:t-1", "t-0", "t-1"]  # until released
    for n in range(2):
        assert await queue.release("mock", f"t-{n}", 1, used=10)
    assert await redis.hlen(keys.fair("mock")) == 0  # type: ignore[misc]


async def counter(redis: Redis, tenant: str) -> float:
    return float(await redis.hget(keys.vtc("mock"), f"t:{tenant}") or 0)  # type: ignore[misc]


async def test_a_tenant_is_charged_what_its_requests_used_not_what_they_reserved(
    queue: Queue, redis: Redis
) -> None:
    """A claim charges the reservation (prompt + max_tokens, here COST); the release
    settles it to the tokens used, divided by the weight."""
    await backlog(queue, "brief", 1, weight=2)
    claim = await claim_with(queue, budget_left=None, idle=True)
    assert await counter(redis, "brief") == COST / 2
    assert await queue.release("mock", "brief-0", claim.attempt, used=30)
    assert await counter(redis, "brief") == 30 / 2
    await backlog(queue, "brief", 1, start=10, weight=2)
    claim = await claim_with(queue, budget_left=None, idle=True)
    assert await queue.release("mock", "brief-0", claim.attempt, used=-1)  # not known
    assert await counter(redis, "brief") == (30 + COST) / 2


async def test_a_request_claimed_again_is_charged_once(queue: Queue, redis: Redis) -> None:
    await backlog(queue, "a", 1)
    first = await claim_with(queue, budget_left=None, idle=True)
    assert await queue.requeue("mock", "a-0", first.attempt)  # its worker stops
    second = await claim_with(queue, budget_left=None, idle=True)
    assert second.request_id == "a-0" and await counter(redis, "a") == COST
    assert await queue.release("mock", "a-0", second.attempt, used=60)
    assert await counter(redis, "a") == 60


async def test_fifo_is_the_queues_order(redis: Redis) -> None:
    queue = Queue(redis, stream_maxlen=100, ttl_seconds=60)
    await backlog(queue, "noisy", 5)
    await backlog(queue, "light", 2, start=100)
    assert await claims(queue, 3) == ["noisy", "noisy", "noisy"]


async def back_to_the_queue(queue: Queue, how: str, rid: str, attempt: int) -> None:
    """Put a running request back in the queue the way ``how`` does."""
    if how == "reaped":  # its worker died: the lease runs out in lease time, then a sweep

        async def reaped() -> bool:
            return (rid, attempt) in await queue.reap("mock")

        await wait_until(reaped, timeout=10, what=f"{rid}'s lease reaped")
    else:  # a hand-back (its worker stops) and a yield requeue alike
        assert await queue.requeue("mock", rid, attempt)


@pytest.mark.parametrize("how", ["hand_back", "yield", "reaped"])
async def test_a_request_back_in_the_queue_is_claimed_in_its_tenants_turn(
    queue: Queue, redis: Redis, how: str
) -> None:
    """b's backlog is older than a's requests, but b was served more: a's two run
    first. a-1 goes back to the queue, behind b's backlog; the claim after b's next is
    a-1's, its tenant's turn, not the end of b's backlog."""
    await backlog(queue, "b", 6)
    await redis.hset(keys.vtc("mock"), "t:b", str(1.5 * COST))  # type: ignore[misc]
    await backlog(queue, "a", 2, start=100)
    first = await claim_with(queue, budget_left=None, idle=True)
    second = await queue.claim(
        "mock",
        lease_ms=1 if how == "reaped" else 3000,
        in_progress_ms=4000,
        budget_left=None,
        idle=True,
    )
    assert [first.request_id, second.request_id] == ["a-0", "a-1"]
    if how == "yield":  # the pool is full and b's next is fair share's: a-1 gives way
        assert await queue.fair_yield("mock", "w1", ["a-1"]) == "a-1"
    await back_to_the_queue(queue, how, "a-1", second.attempt)
    assert await claims(queue, 2) == ["b", "a"]


def test_fair_share_is_on_by_default() -> None:
    assert CommonSettings().fairness == "vtc"


@pytest.mark.parametrize(("fairness", "warned"), [("fifo", True), ("vtc", False)])
async def test_a_weight_that_takes_no_effect_is_said(
    redis_url: str,
    start_api: StartApi,
    fairness: str,
    warned: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Under fifo a tenant's weight does nothing: the command that sets it says so, and
    an API process says so once at start-up."""
    said = "the weights of heavy take no effect"
    assert (await llmq(redis_url, "config", "set", f"fairness={fairness}"))[0] == 0
    for args in (["create", "heavy", "--weight", "3"], ["create", "plain"]):
        code, _, err = await llmq(redis_url, "tenant", *args)
        assert code == 0 and (said in err) == (warned and "heavy" in args), err
    await start_api(fairness=fairness)
    logged = [r.getMessage() for r in caplog.records if said in r.getMessage()]
    assert len(logged) == (1 if warned else 0), logged


async def vtc_api(
    start_api: StartApi, start_worker: StartWorker, redis: Redis, *tenants: str, **worker: Any
) -> RunningApi:
    """``tenants`` in Redis, a worker and an API under ``vtc``, tenants named by header,
    the pool routed as ``worker["routing"]`` says (None: as derived, ``prefix`` for mocks;
    not given: ``fifo``)."""
    store = TenantStore(redis)
    for name in tenants:
        await store.put(Tenant(name=name))
    await start_worker(fairness="vtc", **worker)
    return await start_api(
        tenant_header="X-Tenant", fairness="vtc", routing=worker.get("routing", "fifo")
    )


async def post(client: httpx.AsyncClient, tenant: str, body: dict[str, Any]) -> str:
    """A native request of ``tenant``; its id."""
    r = await client.post("/v1/requests", json=body, headers={"X-Tenant": tenant})
    assert r.status_code == 202, r.text
    rid: str = r.json()["id"]
    return rid


@pytest.mark.parametrize("routing", ["fifo", None])
async def test_through_the_api_a_light_tenant_overtakes_a_noisy_backlog(
    start_api: StartApi, start_worker: StartWorker, redis: Redis, routing: str | None
) -> None:
    """Under the queue's order and under the routing a pool of mocks derives (``prefix``:
    no worker prefers any of these requests, so the least-served tenant's goes first)."""
    api = await vtc_api(
        start_api,
        start_worker,
        redis,
        "noisy",
        "light",
        concurrency=1,
        model_tokens_per_second=200,
        routing=routing,
    )
    body = {"model": "mock", "prompt": "p", "max_tokens": 20, "ignore_eos": True}
    async with api.client(timeout=30) as client:
        await wait_ready(client)
        noisy = [await post(client, "noisy", body) for _ in range(12)]
        done = await wait_status(client, await post(client, "light", body), "done", timeout=30)
        finished_before = 0
        for rid in noisy:
            status = (await client.get(f"/v1/requests/{rid}")).json()
            if status["status"] == "done" and status["finished_at"] < done["finished_at"]:
                finished_before += 1
    assert finished_before <= 3, finished_before  # FIFO: all 12 before it


async def test_a_workers_finish_settles_the_charge_to_the_tokens_used(
    start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    """Requests that stop by themselves (the mock's mean answer is 32 tokens) well
    before ``max_tokens``, claimed or handed straight to the parked worker: the
    tenant's counter holds what they used."""
    api = await vtc_api(
        start_api,
        start_worker,
        redis,
        "brief",
        concurrency=1,
        model_tokens_per_second=500,
        model_mean_tokens=32,
    )
    body = {"model": "mock", "prompt": "p", "max_tokens": 2000}
    async with api.client(timeout=30) as client:
        await wait_ready(client)
        ids = [await post(client, "brief", body) for _ in range(3)]
        used = []
        for rid in ids:
            record = await wait_status(client, rid, "done", timeout=30)
            used.append(record["prompt_tokens"] + record["completion_tokens"])
    assert max(used) < 2000, used
    total = int(sum(used))

    async def settled() -> bool:  # the release follows the answer
        return await counter(redis, "brief") == total

    await wait_until(settled, timeout=10, what=f"the charges settled to {total}")


async def test_a_full_pool_gives_a_slot_to_a_tenant_below_its_share(queue: Queue) -> None:
    """Noisy holds both running requests; light's request would be served next: one
    noisy run gives way (the candidate named first), once for that waiting request."""
    await backlog(queue, "noisy", 6)
    assert await claims(queue, 2) == ["noisy", "noisy"]
    assert await queue.fair_yield("mock", "w1", ["noisy-1", "noisy-0"]) is None  # alone
    await backlog(queue, "light", 1, start=100)
    assert await queue.fair_yield("mock", "w1", ["noisy-1", "noisy-0"]) == "noisy-1"
    assert await queue.fair_yield("mock", "w2", ["noisy-0"]) is None  # one slot for it


async def test_no_slot_is_given_past_an_even_share(queue: Queue) -> None:
    await backlog(queue, "noisy", 6, weight=1)
    await backlog(queue, "light", 6, start=100, weight=1)
    assert sorted(await claims(queue, 2)) == ["light", "noisy"]  # one each: even
    assert await queue.fair_yield("mock", "w1", ["noisy-0", "light-0"]) is None


@pytest.mark.parametrize(("noisy_running", "gives_way"), [(2, True), (1, False)])
async def test_a_tenant_served_less_of_late_may_hold_more_than_an_even_share(
    queue: Queue, noisy_running: int, gives_way: bool
) -> None:
    """Noisy's requests cost ten times light's, so of late noisy was served far more.
    With two of the four running requests each, light's next request still gets a slot
    (three of four: its credit); holding three of four already, it does not get all four."""
    await backlog(queue, "noisy", 3, cost=10 * COST)
    assert await claims(queue, noisy_running) == ["noisy"] * noisy_running
    await backlog(queue, "light", 4, start=100)
    light_running = 4 - noisy_running
    assert await claims(queue, light_running) == ["light"] * light_running
    candidates = [f"noisy-{i}" for i in range(noisy_running)]
    expected = candidates[0] if gives_way else None
    assert await queue.fair_yield("mock", "w1", candidates) == expected


async def test_a_slot_is_not_given_across_priority_bands(queue: Queue) -> None:
    await backlog(queue, "noisy", 2, priority=5)
    assert await claims(queue, 2) == ["noisy", "noisy"]
    await backlog(queue, "light", 1, start=100, priority=0)  # another band
    assert await queue.fair_yield("mock", "w1", ["noisy-0"]) is None


async def test_a_light_tenant_starts_at_once_beside_a_noisy_one_filling_the_pool(
    start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    """Noisy's requests fill both slots for 1.5 s each and queue behind; light's request
    starts within a token or so (a noisy run gives way, resumes later and still ends
    with all its tokens), not when a noisy run ends."""
    api = await vtc_api(
        start_api,
        start_worker,
        redis,
        "noisy",
        "light",
        concurrency=2,
        model_tokens_per_second=100,
        routing="fifo",
    )
    body = {"model": "mock", "prompt": "p", "max_tokens": 150, "ignore_eos": True}
    async with api.client(timeout=60) as client:
        await wait_ready(client)
        noisy = [await post(client, "noisy", body) for _ in range(3)]
        for rid in noisy[:2]:
            await wait_status(client, rid, "running")
        light = await wait_status(client, await post(client, "light", body), "done", timeout=30)
        assert light["started_at"] - light["created_at"] < 0.75, light  # a run: 1.5 s
        ended = [await wait_status(client, rid, "done", timeout=40) for rid in noisy]
    assert all(r["completion_tokens"] == 150 for r in ended), ended
    yielded = [await redis.hget(keys.request(rid), "yields") for rid in noisy]  # type: ignore[misc]
    assert yielded.count("1") == 1, yielded


@pytest.mark.parametrize("slack", [0, 10 * COST])
async def test_under_routing_affinity_chooses_within_the_slack(redis: Redis, slack: int) -> None:
    """A routed claim's window holds the tenants within the slack of the least counter,
    the least-served first, so the light tenant's request, queued behind a backlog the
    routed window (16) does not reach, goes next where affinity prefers no request (no
    hints here), whatever the slack; the slack only lets affinity choose past it."""
    settings = CommonSettings(routing="prefix", routing_window=16)
    queue = Queue(
        redis,
        stream_maxlen=100,
        ttl_seconds=60,
        routing=routing_from(settings),
        fairness="vtc",
        fair_slack=slack,
    )
    await backlog(queue, "noisy", 30)
    await backlog(queue, "light", 1, start=1000)
    assert await claims(queue, 3) == ["noisy", "light", "noisy"]


async def test_a_batch_only_tenant_waits_below_every_interactive_request(queue: Queue) -> None:
    """Batch lines are a band of their own: a tenant with nothing but batch lines, however
    little it was served, does not take a turn before another tenant's live requests."""
    for i in range(2):
        await enqueue_costing(
            queue,
            f"bulk-{i}",
            cost=COST,
            score=BATCH_BAND_MS + i,
            fair=fair_entry("bulk", 1, BATCH_FAIR_PRIORITY),
        )
    await backlog(queue, "live", 3, start=100)
    assert await claims(queue, 5) == ["live", "live", "live", "bulk", "bulk"]


def test_a_batch_lines_fair_entry_names_the_batch_band() -> None:
    payload = JobPayload(
        request_id="r",
        model="mock",
        prompt="p",
        prompt_tokens=1,
        params=SamplingParams(max_tokens=4),
        enqueued_at=1.0,
        queue_deadline=2.0,
        generation_timeout=3.0,
        tenant="acme",
    )
    live = Enqueue.of(payload, priority_step_ms=1000, weight=2)
    line = Enqueue.of(payload.model_copy(update={"batch": "batch_1"}), priority_step_ms=1000)
    assert live.fair == "acme|2|0"
    assert line.fair == f"acme|1|{BATCH_FAIR_PRIORITY}"


async def test_a_finish_told_what_the_run_used_settles_without_reading_the_record(
    queue: Queue, redis: Redis
) -> None:
    """A worker says what its run used (the record's prompt + completion, as it wrote
    them): the release settles the tenant's charge to it, and the record is read once,
    for the quota, in the release's own round trip."""
    await backlog(queue, "brief", 1)
    claim = await claim_with(queue, budget_left=None, idle=True)
    assert claim.request_id is not None
    await queue.release("mock", "none", 1)  # the script loaded: the pipeline runs once
    await redis.config_resetstat()
    await queue.finish("mock", claim.request_id, claim.attempt, used=30)
    assert await counter(redis, "brief") == 30
    stats = await redis.info("commandstats")
    assert stats["cmdstat_hmget"]["calls"] == 1


async def test_a_no_says_when_only_one_tenants_requests_wait(queue: Queue) -> None:
    """``fair_yield.lua``'s no names the one tenant whose requests wait ("" for none),
    which no later call can change for that tenant's runs until another's is queued."""
    await backlog(queue, "noisy", 3)
    assert await claims(queue, 2) == ["noisy", "noisy"]
    answer = await queue.fair_answer("mock", "w1", ["noisy-1", "noisy-0"])
    assert (answer.request_id, answer.only) == (None, "noisy")
    await backlog(queue, "other", 1, start=100, priority=1)  # waits, in a later band
    answer = await queue.fair_answer("mock", "w1", ["noisy-1", "noisy-0"])
    assert (answer.request_id, answer.only) == (None, None)
    await redis_of(queue).delete(keys.queue("mock"))
    answer = await queue.fair_answer("mock", "w1", ["noisy-1"])
    assert (answer.request_id, answer.only) == (None, "")


def redis_of(queue: Queue) -> Redis:
    return queue.redis


async def test_a_full_worker_asks_fair_share_again_only_when_another_tenant_may_wait(
    start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    """A full worker whose runs are the default tenant's, while only that tenant's
    requests are queued, asks ``fair_yield.lua`` once for the empty queue and once
    after the first wake-up: not on every later wake-up (each poll, each request)."""
    await start_worker(fairness="vtc", concurrency=1, model_tokens_per_second=50)
    api = await start_api(fairness="vtc")
    sha = scripts_for(redis).fair_yield.sha
    seen: list[str] = []

    async def watch() -> None:
        async with redis.monitor() as monitor:
            async for command in monitor.listen():
                seen.append(str(command["command"]))

    watching = asyncio.create_task(watch())
    try:
        async with api.client(timeout=30) as client:
            await wait_ready(client)
            long = {"model": "mock", "prompt": "p", "max_tokens": 100, "ignore_eos": True}
            first = (await client.post("/v1/requests", json=long)).json()["id"]
            await wait_status(client, first, "running", timeout=10)
            short = {**long, "max_tokens": 5}
            rids = [(await client.post("/v1/requests", json=short)).json()["id"] for _ in range(3)]
            for rid in [first, *rids]:  # 2 s full, 4 polls at least, then 3 more runs
                await wait_status(client, rid, "done", timeout=30)
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
    assert any(first in command for command in seen)  # the monitor saw the run
    asked = [command for command in seen if sha in command]
    assert 1 <= len(asked) <= 2, asked
