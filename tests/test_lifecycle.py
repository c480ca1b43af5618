"""The lifecycle stream: every state change, readable by consumer groups and `llmq tail`."""

from __future__ import annotations

import json

import pytest
from redis.asyncio import Redis

from llmq.protocol import keys
from llmq.tail import CLIENT_NAME
from tests.support.cluster import BOTH_BACKENDS
from tests.support.native import post_request, wait_ready, wait_status
from tests.support.processes import Proc, clean_env
from tests.support.servers import StartApi, StartWorker
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


async def entries(redis: Redis, rid: str) -> list[dict[str, object]]:
    out = []
    for _, fields in await redis.xrange(keys.lifecycle(rid)):
        if fields["request_id"] == rid:
            data = json.loads(fields["data"])
            assert data["event"] == fields["event"] and data["model"] == fields["model"]
            out.append(data)
    return out


async def test_a_request_leaves_its_trail(
    start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    await start_worker()
    api = await start_api()
    async with api.client() as client:
        await wait_ready(client)
        rid = await post_request(client, "trail", max_tokens=5, priority=2)
        # a group from the start of the stream: it is given every entry, the first too
        await redis.xgroup_create(keys.lifecycle(rid), "observers", id="0", mkstream=True)
        await wait_status(client, rid, "done")

        async def all_four() -> bool:
            return len(await entries(redis, rid)) == 4

        await wait_until(all_four, timeout=5, what="four lifecycle entries")
    trail = await entries(redis, rid)
    assert [e["event"] for e in trail] == ["queued", "started", "first_token", "finished"]
    assert trail[0]["priority"] == 2 and trail[1]["attempt"] == 1
    assert trail[3]["finish_reason"] == "length" and trail[3]["completion_tokens"] == 5
    assert 0 < trail[2]["ttft_ms"] <= trail[3]["e2e_ms"]  # type: ignore[operator]
    read = await redis.xreadgroup("observers", "one", {keys.lifecycle(rid): ">"}, count=100)
    assert {f["event"] for _, f in read[0][1] if f["request_id"] == rid} == {
        "queued",
        "started",
        "first_token",
        "finished",
    }


@BOTH_BACKENDS
async def test_cancelled_and_expired_while_queued(start_api: StartApi, redis: Redis) -> None:
    api = await start_api(accept_models="mock", sweep_seconds=0.05)
    async with api.client() as client:
        cancelled = await post_request(client, "never", max_tokens=5)
        await client.delete(f"/v1/requests/{cancelled}")
        expired = await post_request(client, "late", max_tokens=5, queue_timeout=0.2)
        await wait_status(client, expired, "failed")
    assert [e["event"] for e in await entries(redis, cancelled)] == ["queued", "cancelled"]
    last = (await entries(redis, expired))[-1]
    assert last["event"] == "failed" and last["finish_reason"] == "timeout"


async def test_llmq_tail_follows_live(
    start_api: StartApi, start_worker: StartWorker, redis_url: str, redis: Redis
) -> None:
    await start_worker()
    api = await start_api()
    tail = Proc(["tail", "--redis-url", redis_url], clean_env())
    try:

        async def following() -> bool:
            clients = await redis.client_list()
            return any(c.get("name") == CLIENT_NAME and c.get("cmd") == "xread" for c in clients)

        await wait_until(following, timeout=20, what="llmq tail to block on the stream")
        async with api.client() as client:
            await wait_ready(client)
            rid = await post_request(client, "watched", max_tokens=3)
            await wait_status(client, rid, "done")

        def events() -> list[str]:
            lines = [line.split() for line in tail.output().splitlines()]
            return [words[1] for words in lines if len(words) > 2 and words[2] == rid]

        await wait_until(lambda: len(events()) == 4, timeout=10, what="four lines")
    finally:
        tail.stop()
    assert events() == ["queued", "started", "first_token", "finished"]


async def test_queue_depth_by_priority_gauge(start_api: StartApi) -> None:
    api = await start_api(accept_models="mock")
    async with api.client() as client:
        for priority in (0, 0, 5, 5, 5, -1):
            await post_request(client, "waiting", max_tokens=2, priority=priority)
        text = (await client.get("/metrics")).text
    lines = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line.startswith("llmq_queue_depth")
    }
    assert lines['llmq_queue_depth{model="mock"}'] == 6
    assert lines['llmq_queue_depth_by_priority{model="mock",priority="5"}'] == 3
    assert lines['llmq_queue_depth_by_priority{model="mock",priority="0"}'] == 2
    assert lines['llmq_queue_depth_by_priority{model="mock",priority="-1"}'] == 1
