"""Work survives failures: a worker killed or stopped mid-generation loses nothing."""

from __future__ import annotations

import asyncio
import json
import signal

import httpx
import pytest
from redis.asyncio import Redis

from llmq.embedded import free_port
from llmq.protocol import keys
from tests.support.cluster import BOTH_BACKENDS
from tests.support.native import post_request, record, wait_ready, wait_status
from tests.support.processes import Proc, clean_env
from tests.support.servers import SpawnWorkers, StartApi
from tests.support.sse import frames
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(90)

BODY = {"model": "mock", "prompt": "survive this", "max_tokens": 80, "seed": 11}


async def nothing_running(redis: Redis) -> None:
    """The running set empties; the worker releases a request just after its last event."""

    async def empty() -> bool:
        return int(await redis.zcard(keys.running("mock"))) == 0

    await wait_until(empty, timeout=5, what="the running set to empty")


@pytest.mark.slow
async def test_worker_killed_mid_stream_the_client_sees_every_token_once(
    start_api: StartApi, spawn_workers: SpawnWorkers, redis: Redis
) -> None:
    procs = await spawn_workers(2, concurrency=1, model_tokens_per_second=50, lease_seconds=1)
    api = await start_api()
    async with api.client() as client:
        expected = (await client.post("/v1/completions", json=BODY)).json()
        text = ""
        killed = False
        rid = ""
        body = {**BODY, "stream": True}
        async with client.stream("POST", "/v1/completions", json=body) as r:
            async for frame in frames(r):
                if frame.data == "[DONE]":
                    break
                chunk = frame.json()
                rid = chunk["id"].split("-", 1)[1]
                text += chunk["choices"][0]["text"] if chunk["choices"] else ""
                if not killed and len(text.split()) >= 10:
                    worker = (await record(client, rid))["worker"]
                    victim = next(p for p in procs if f"-{p.pid}-" in worker)
                    victim.signal(signal.SIGKILL)
                    killed = True
        final = await record(client, rid)
    assert killed
    assert text == expected["choices"][0]["text"], "tokens lost or repeated"
    assert final["attempts"] == 2 and final["status"] == "done"
    assert final["worker"] != worker


@BOTH_BACKENDS
async def test_sigterm_hands_back_what_the_drain_window_could_not_finish(
    start_api: StartApi, spawn_workers: SpawnWorkers
) -> None:
    procs = await spawn_workers(2, concurrency=1, model_tokens_per_second=50, drain_seconds=0.3)
    api = await start_api()
    async with api.client() as client:
        rid = await post_request(client, "survive this", max_tokens=80, seed=11)
        running = await wait_status(client, rid, "running")
        owner = next(p for p in procs if f"-{p.pid}-" in running["worker"])
        owner.signal(signal.SIGTERM)
        assert owner.wait(15) == 0
        done = await wait_status(client, rid, "done", timeout=20)
    assert done["attempts"] == 2 and done["completion_tokens"] == 80
    assert "handed back to the queue" in owner.output()


async def test_reaper_requeues_a_dead_workers_requests(
    start_api: StartApi, spawn_workers: SpawnWorkers, redis: Redis
) -> None:
    """Recovery is driven by leases: within seconds, not arq's job_timeout + 10 s."""
    (victim,) = await spawn_workers(1, concurrency=2, model_tokens_per_second=20, lease_seconds=1)
    api = await start_api()
    async with api.client() as client:
        ids = [await post_request(client, f"r{i}", max_tokens=200) for i in range(2)]
        for rid in ids:
            await wait_status(client, rid, "running")
        (survivor,) = await spawn_workers(1, concurrency=2, model_tokens_per_second=400)
        victim.signal(signal.SIGKILL)

        async def recovered() -> bool:
            records = [await record(client, rid) for rid in ids]
            return all(r["attempts"] == 2 for r in records)

        # lease 1 s + sweep; the 10 s bound is a loaded machine's margin, far below stock
        # arq's job_timeout + 10 s
        await wait_until(recovered, timeout=10, what="the dead worker's requests to restart")
        for rid in ids:
            done = await wait_status(client, rid, "done", timeout=20)
            assert done["completion_tokens"] == 200
            assert f"-{survivor.pid}-" in done["worker"]
    await nothing_running(redis)


@BOTH_BACKENDS
async def test_native_client_resumes_on_another_api_after_one_dies(
    start_api: StartApi, spawn_workers: SpawnWorkers, redis_url: str
) -> None:
    """API A is SIGKILLed mid-stream; the client resumes on API B with Last-Event-ID."""
    await spawn_workers(1, concurrency=1, model_tokens_per_second=50)
    port = free_port()
    doomed = Proc(["api"], clean_env(LLMQ_REDIS_URL=redis_url, LLMQ_PORT=str(port)))
    survivor = await start_api()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as a:
            await wait_ready(a, timeout=30, path="/healthz")
            rid = await post_request(a, "keep streaming", max_tokens=40)
            seen: list[tuple[str | None, str]] = []
            with pytest.raises(httpx.HTTPError):
                async with a.stream("GET", f"/v1/requests/{rid}/events") as r:
                    async for frame in frames(r):
                        seen.append((frame.id, frame.data))
                        if len(seen) == 3:
                            doomed.popen.kill()
        async with survivor.client() as b:
            headers = {"Last-Event-ID": seen[-1][0] or ""}
            async with b.stream("GET", f"/v1/requests/{rid}/events", headers=headers) as r:
                rest = [(f.id, f.data) async for f in frames(r)]
    finally:
        doomed.stop()
    events = [json.loads(d) for _, d in seen + rest]
    ids = [i for i, _ in seen + rest]
    assert len(set(ids)) == len(ids), "an event was repeated"
    tokens = [t for e in events if e["type"] == "tokens" for t in e["tokens"]]
    assert len(tokens) == 40 and events[-1]["type"] == "done"


@BOTH_BACKENDS
async def test_openai_stream_is_cancelled_after_its_api_process_dies(
    start_api: StartApi, spawn_workers: SpawnWorkers, redis_url: str, redis: Redis
) -> None:
    """An OpenAI client cannot resume elsewhere: its request must not hold a slot."""
    await spawn_workers(1, concurrency=1, model_tokens_per_second=50)
    port = free_port()
    env = clean_env(
        LLMQ_REDIS_URL=redis_url,
        LLMQ_PORT=str(port),
        LLMQ_HEARTBEAT_SECONDS="0.2",
        LLMQ_ORPHAN_GRACE_SECONDS="1",
    )
    doomed = Proc(["api"], env)
    survivor = await start_api()
    body = {**BODY, "max_tokens": 1000, "stream": True}
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as a:
            await wait_ready(a, timeout=30, path="/healthz")
            chunks = 0
            with pytest.raises(httpx.HTTPError):
                async with a.stream("POST", "/v1/completions", json=body) as r:
                    async for frame in frames(r):
                        rid = json.loads(frame.data)["id"].removeprefix("cmpl-")
                        chunks += 1
                        if chunks == 3:
                            doomed.popen.kill()
        async with survivor.client() as b:
            killed = await wait_status(b, rid, "cancelled", timeout=10)
            assert killed["completion_tokens"] < 1000
            # the slot is free: the next request starts at once
            nxt = await post_request(b, "next", max_tokens=2)
            await wait_status(b, nxt, "done", timeout=10)
    finally:
        doomed.stop()
    await nothing_running(redis)

    async def forgotten() -> bool:
        return int(await redis.zcard(keys.APIS)) == 1  # only the survivor is left

    await wait_until(forgotten, timeout=10, what="the dead API process to be forgotten")


@BOTH_BACKENDS
async def test_a_killed_parked_worker_is_skipped_and_nothing_waits_for_it(
    start_api: StartApi, spawn_workers: SpawnWorkers, redis: Redis
) -> None:
    """A dead idle worker is still parked, but no request is handed to it: the enqueue
    script's PUBLISH finds nobody on its channel, drops it and tries the next one."""
    victim, survivor = await spawn_workers(2, concurrency=2)

    async def both_parked() -> bool:
        return int(await redis.zcard(keys.parked("mock"))) == 2

    await wait_until(both_parked, timeout=10, what="both workers to park")
    victim.signal(signal.SIGKILL)
    await asyncio.to_thread(victim.wait, 10)
    api = await start_api()
    async with api.client() as client:
        await wait_ready(client)
        ids = [await post_request(client, f"r{i}", max_tokens=3) for i in range(4)]
        for rid in ids:
            done = await wait_status(client, rid, "done", timeout=10)
            assert f"-{survivor.pid}-" in done["worker"]
            assert done["attempts"] == 1  # never handed to the dead one (that needs a re-run)
    parked = await redis.zrange(keys.parked("mock"), 0, -1)
    assert not [w for w in parked if f"-{victim.pid}-" in w]
