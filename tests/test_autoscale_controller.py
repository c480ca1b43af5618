"""The controller against a real Redis: one leader acts, every decision is visible,
and a model with no worker is accepted while an autoscaler serves it."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest
from redis.asyncio import Redis

from llmq import metrics
from llmq.autoscale.controller import Controller
from llmq.autoscale.drivers import PublishDriver
from llmq.autoscale.lease import LeaderLease
from llmq.autoscale.signals import ClusterProbe, Snapshot
from llmq.autoscale.state import autoscaled
from llmq.protocol import keys
from llmq.protocol.streams import lifecycle_entries
from llmq.schema import WorkerInfo
from llmq.settings import ControllerSettings
from tests.support.native import post_request, wait_status
from tests.support.servers import StartApi, StartWorker
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


def controller_settings(redis_url: str, **overrides: Any) -> ControllerSettings:
    chosen: dict[str, Any] = {
        "redis_url": redis_url,
        "scale_interval_seconds": 0.05,
        "autoscaler_lease_seconds": 0.3,
        **overrides,
    }
    return ControllerSettings(**chosen)


class ListingDriver(PublishDriver):
    """Acts on nothing; notes who acted and whom the lease in Redis named right then."""

    def __init__(self, redis: Redis, me: str, acts: list[tuple[str, str | None]]) -> None:
        self.redis, self.me, self.acts = redis, me, acts

    async def scale(self, model: str, target: int, live: tuple[WorkerInfo, ...]) -> None:
        self.acts.append((self.me, await self.redis.get(keys.AUTOSCALER_LEADER)))


@pytest.mark.slow
async def test_two_controllers_never_both_act(redis_url: str, redis: Redis) -> None:
    """Both want to act every period (a request queued, no worker); each one stalls now
    and then for longer than the lease, as a paused process or a slow Redis would."""
    await redis.zadd(keys.queue("mock"), {"r1": 1})
    acts: list[tuple[str, str | None]] = []
    controllers = []
    rng = random.Random(3)
    for name in ("a", "b"):
        settings = controller_settings(redis_url)
        lease = LeaderLease(redis, settings.autoscaler_lease_seconds, owner=name)
        c = Controller(
            redis,
            settings,
            ["mock"],
            ListingDriver(redis, name, acts),
            bounds=(0, 4),
            concurrency=2,
            lease=lease,
        )
        probe = c.probes["mock"]
        read = probe.snapshot

        async def stalling(read: Any = read) -> Snapshot:
            if rng.random() < 0.2:
                await asyncio.sleep(0.5)  # longer than the 0.3 s lease
            snap: Snapshot = await read()
            return snap

        probe.snapshot = stalling  # type: ignore[method-assign]
        controllers.append(c)
    stop = asyncio.Event()
    runs = [asyncio.create_task(c.run(stop)) for c in controllers]
    await wait_until(
        lambda: {me for me, _ in acts} == {"a", "b"} and len(acts) >= 30,
        timeout=30,
        what="both controllers to have led at some point",
    )
    stop.set()
    await asyncio.gather(*runs)
    wrong = [(me, holder) for me, holder in acts if holder != me]
    assert wrong == [], f"acted without holding the lease: {wrong[:5]} of {len(acts)}"


async def test_every_decision_is_visible(redis_url: str, redis: Redis) -> None:
    await redis.zadd(keys.queue("mock"), {"r1": 1, "r2": 2, "r3": 3})
    settings = controller_settings(redis_url)
    c = Controller(redis, settings, ["mock"], PublishDriver(), bounds=(0, 4), concurrency=2)
    stop = asyncio.Event()
    run = asyncio.create_task(c.run(stop))

    async def published() -> bool:
        return "mock" in await autoscaled(redis)

    await wait_until(published, timeout=10, what="the published state")
    state = (await autoscaled(redis))["mock"]
    # cold: every queued request gets a slot: 3 requests / 2 slots = 2 workers
    assert (state.desired, state.actual) == (2, 0)
    stop.set()
    await run
    counts = await redis.hgetall(keys.metric(metrics.AUTOSCALER_ACTIONS.name))  # type: ignore[misc]
    assert counts == {json.dumps(["", "mock", "up", "activation"]): "1"}
    entries = await lifecycle_entries(redis)
    scaled = [json.loads(f["data"]) for _, f in entries if f["event"] == "scaled"]
    assert len(scaled) == 1
    assert {k: scaled[0][k] for k in ("direction", "reason", "actual", "target")} == {
        "direction": "up",
        "reason": "activation",
        "actual": 0,
        "target": 2,
    }
    assert await redis.get(keys.AUTOSCALER_LEADER) is None, "the lease is released on stop"


async def test_a_model_without_workers_is_accepted_while_autoscaled(
    redis_url: str, redis: Redis, start_api: StartApi, start_worker: StartWorker
) -> None:
    api = await start_api()
    async with api.client() as client:
        body = {"model": "mock", "prompt": "p", "max_tokens": 3}
        refused = await client.post("/v1/requests", json=body)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "no_workers"
        assert (await client.get("/readyz")).status_code == 503

        settings = controller_settings(redis_url, scale_interval_seconds=0.2)
        c = Controller(redis, settings, ["mock"], PublishDriver(), bounds=(0, 2), concurrency=2)
        stop = asyncio.Event()
        run = asyncio.create_task(c.run(stop))
        try:

            async def ready() -> bool:
                return (await client.get("/readyz")).status_code == 200

            await wait_until(ready, timeout=10, what="/readyz with an autoscaler")
            rid = await post_request(client, max_tokens=3)

            async def gauge() -> bool:
                text = (await client.get("/metrics")).text
                return 'llmq_autoscaler_desired_workers{model="mock"} 1.0' in text

            await wait_until(gauge, timeout=10, what="the desired-workers gauge")
            text = (await client.get("/metrics")).text
            assert 'llmq_autoscaler_max_workers{model="mock"} 2.0' in text  # bounds' MAX
            await start_worker()  # what the driver (KEDA, llmq run) does
            done = await wait_status(client, rid, "done")
            assert done["completion_tokens"] == 3
        finally:
            stop.set()
            await run


async def test_arrivals_are_the_enqueues_of_the_model_at_once(
    redis_url: str, redis: Redis, start_api: StartApi, start_worker: StartWorker
) -> None:
    """Counted from the enqueue script's lifecycle entries, not from the metric totals:
    requests that already finished count at once, before their worker's next flush."""
    api = await start_api()
    await start_worker()
    probe = ClusterProbe(redis, "mock", worker_ttl=5.0)
    await probe.snapshot()
    async with api.client() as client:

        async def ready() -> bool:  # the API has seen the worker
            return (await client.get("/readyz")).status_code == 200

        await wait_until(ready, timeout=10, what="/readyz with a worker")
        rids = [await post_request(client, max_tokens=2) for _ in range(4)]
        for rid in rids:
            await wait_status(client, rid, "done")
        await redis.xadd(keys.lifecycle("x"), {"event": "queued", "model": "other", "data": "{}"})
        await probe.snapshot()
    assert probe.arrived(60.0) == 4
    assert probe.arrival_rate(60.0) > 0
