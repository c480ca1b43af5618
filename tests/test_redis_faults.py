"""Redis restarted, stalled or cut off mid-generation; a worker fenced after losing
its lease. Each test checks what the clients saw and what Redis holds afterwards."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from typing import Any, cast

import httpx
import pytest
from redis.asyncio import Redis

from llmq.embedded import EmbeddedRedis, free_port
from llmq.protocol import keys
from llmq.schema import DoneEvent, StartedEvent, TokensEvent
from tests.support.native import post_request, record, wait_ready, wait_status
from tests.support.processes import Proc, clean_env
from tests.support.runs import stream_events, undisturbed
from tests.support.servers import RunningApi, SpawnWorkers, StartApi, StartWorker
from tests.support.sse import frames, openai_chunks
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

#: Short timeouts, so that an outage is noticed quickly.
FAST_FAIL = {"redis_pool_timeout_seconds": 1.0, "redis_socket_timeout_seconds": 1.0}
SEED = 21


class NativeReader:
    """Follows a request's native event stream; ``seen`` is set once enough tokens came."""

    def __init__(self, client: httpx.AsyncClient, rid: str, after_tokens: int) -> None:
        self.indices: list[int] = []
        self.tokens: list[str] = []
        self.last: dict[str, Any] = {}
        self.seen = asyncio.Event()
        self.task = asyncio.create_task(self._read(client, rid, after_tokens))

    async def _read(self, client: httpx.AsyncClient, rid: str, after_tokens: int) -> None:
        async with client.stream("GET", f"/v1/requests/{rid}/events") as r:
            async for frame in frames(r):
                event = frame.json()
                self.last = event
                if event["type"] == "tokens":
                    for i, token in enumerate(event["tokens"]):
                        self.indices.append(event["index"] + i)
                        self.tokens.append(token)
                    if len(self.tokens) >= after_tokens:
                        self.seen.set()
                elif event["type"] in ("done", "error"):
                    return


async def openai_stream(client: httpx.AsyncClient, max_tokens: int) -> list[Any]:
    body = {
        "model": "mock",
        "prompt": "through the outage",
        "max_tokens": max_tokens,
        "seed": SEED,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with client.stream("POST", "/v1/completions", json=body) as r:
        return await openai_chunks(r)


async def check_redis_after(redis: Redis, rid: str, n: int) -> None:
    """Nothing left running or queued; the record is terminal; the stream holds each
    index once, and its end counts what it holds."""

    async def settled() -> bool:
        busy = await redis.zcard(keys.running("mock")) + await redis.zcard(keys.queue("mock"))
        return int(busy) == 0

    await wait_until(settled, timeout=10, what="the running set and the queue to empty")
    fields = await redis.hgetall(keys.request(rid))  # type: ignore[misc]
    assert fields["status"] == "done" and fields["completion_tokens"] == str(n)
    events = [e for _, e in await stream_events(redis, rid)]
    indices = [
        e.index + i for e in events if isinstance(e, TokensEvent) for i in range(len(e.tokens))
    ]
    assert indices == list(range(n)), "an index missing or written twice in the stream"
    ends = [e for e in events if e.type in ("done", "error")]
    assert len(ends) == 1 and ends[0].usage is not None
    assert ends[0].usage.completion_tokens == n


async def two_clients_through(
    api: RunningApi,
    redis_url: str,
    max_tokens: int,
    fault: Any,
) -> None:
    """A native and an OpenAI client stream the same seeded request while ``fault``
    runs (once each has seen 10 tokens); both get every token once and a clean end."""
    expected = await undisturbed(max_tokens, SEED)
    async with api.client(timeout=30) as c:
        await wait_ready(c)
        rid = await post_request(c, "through the outage", max_tokens=max_tokens, seed=SEED)
        native = NativeReader(c, rid, after_tokens=10)
        openai = asyncio.create_task(openai_stream(c, max_tokens))
        await asyncio.wait_for(native.seen.wait(), timeout=20)
        await fault()
        # new requests are accepted at once: the workers are not taken for dead
        await post_request(c, "right after the fault", max_tokens=2)
        await asyncio.wait_for(native.task, timeout=30)
        chunks = await asyncio.wait_for(openai, timeout=30)
        final = await record(c, rid)
    # native: every index once, then done with the count received
    assert native.indices == list(range(max_tokens))
    assert native.tokens == expected
    assert native.last["type"] == "done", native.last
    assert native.last["usage"]["completion_tokens"] == max_tokens
    # OpenAI: all the text, not cancelled, counts that match
    assert all("error" not in c for c in chunks), chunks[-1]
    text = "".join(c["choices"][0]["text"] for c in chunks if c.get("choices"))
    assert text == "".join(expected)
    reasons = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices")]
    assert reasons[-1] == "length"
    assert next(c["usage"] for c in chunks if c.get("usage"))["completion_tokens"] == max_tokens
    # Redis: both requests ended, ran once, nothing left behind
    assert final["attempts"] == 1, "re-run although its worker was alive"
    client = Redis.from_url(redis_url, decode_responses=True)
    try:
        await check_redis_after(client, rid, max_tokens)
        openai_rid = chunks[0]["id"].split("-", 1)[1]
        await check_redis_after(client, openai_rid, max_tokens)
        openai_record = await client.hgetall(keys.request(openai_rid))
        assert openai_record["attempts"] == "1"
    finally:
        await client.aclose()


@pytest.mark.parametrize("ends_in_outage", [False, True], ids=["mid-run", "at-the-end"])
async def test_a_redis_restart_loses_no_token_and_leaves_nothing_stuck(
    own_redis: EmbeddedRedis, start_api: StartApi, start_worker: StartWorker, ends_in_outage: bool
) -> None:
    """SIGTERM Redis (AOF on) and start it again on the same port and directory, while
    the generation runs on, or ends, during the outage."""
    max_tokens, outage = (30, 1.2) if ends_in_outage else (80, 0.5)
    await start_worker(redis_url=own_redis.url, model_tokens_per_second=50, **FAST_FAIL)
    api = await start_api(redis_url=own_redis.url, relay_block_ms=500, **FAST_FAIL)

    async def restart() -> None:
        await asyncio.to_thread(own_redis.stop, remove=False)
        await asyncio.sleep(outage)  # the outage itself
        await asyncio.to_thread(own_redis.start)

    await two_clients_through(api, own_redis.url, max_tokens, restart)


@pytest.mark.parametrize("how", ["debug-sleep", "sigstop"])
@pytest.mark.slow
async def test_a_redis_stall_longer_than_a_lease_reaps_nobody(
    own_redis: EmbeddedRedis, start_api: StartApi, start_worker: StartWorker, how: str
) -> None:
    """A 2.5 s stall: longer than the worker's lease (1 s) and the API process's
    (1 s). Nothing re-runs, no index twice, the OpenAI stream is not cancelled.

    Renewals every 0.5 s and sweeps every 0.05 s: after the stall, a sweep's reap
    (or orphan check) almost always reaches Redis before the next renewal, as it
    would with many reapers, so a lease judged in real time would be found expired.
    """
    stall = 2.5
    fast_sweep = {"sweep_seconds": 0.05, "heartbeat_seconds": 0.5}
    await start_worker(
        redis_url=own_redis.url, model_tokens_per_second=50, lease_seconds=1, **fast_sweep
    )
    api = await start_api(
        redis_url=own_redis.url, relay_block_ms=500, orphan_grace_seconds=1, **fast_sweep
    )

    async def stall_redis() -> None:
        if how == "sigstop":
            assert own_redis.process is not None
            own_redis.process.send_signal(signal.SIGSTOP)
            await asyncio.sleep(stall)  # the stall itself
            own_redis.process.send_signal(signal.SIGCONT)
            return
        sleeper = Redis.from_url(own_redis.url)
        try:
            await cast(Any, sleeper).execute_command("DEBUG", "SLEEP", stall)
        finally:
            await sleeper.aclose()

    await two_clients_through(api, own_redis.url, 100, stall_redis)


async def pubsub_clients(redis: Redis) -> int:
    return len(await redis.client_list(_type="pubsub"))


async def subscribed(redis: Redis) -> bool:
    return await pubsub_clients(redis) > 0


async def test_a_cancel_sent_while_the_worker_is_not_subscribed_still_stops_it(
    stack: RunningApi, redis: Redis
) -> None:
    """The cancel message is lost (the worker's pub/sub connection is down); the cancel
    flag, read with the next lease renewal (every 0.2 s here), stops the request."""
    async with stack.client() as client:
        rid = await post_request(client, "cancel me", max_tokens=1000)  # 5 s at 200 tokens/s
        await wait_status(client, rid, "running")
        # each kill doubles the listener's reconnect delay: after three it stays away
        # for 0.4 s, longer than the cancel below takes
        for _ in range(3):
            await wait_until(lambda: subscribed(redis), timeout=5, what="the listener to subscribe")
            await redis.client_kill_filter(_type="pubsub")
        t0 = time.monotonic()
        assert (await client.delete(f"/v1/requests/{rid}")).status_code == 200
        assert await pubsub_clients(redis) == 0, "the listener got the message"
        stopped = await wait_status(client, rid, "cancelled", "done", timeout=10)
        took = time.monotonic() - t0
    assert stopped["status"] == "cancelled" and stopped["completion_tokens"] < 1000
    # one renewal (0.2 s) on a quiet machine; the bound is a loaded machine's margin,
    # well short of the 5 s the request would run if nothing stopped it
    assert took < 3.0, took
    # Redis: the slot is free, and the stream ends with the cancel, counting what it holds
    await wait_until(
        lambda: no_running(redis), timeout=5, what="the cancelled request's lease to go"
    )
    events = [e for _, e in await stream_events(redis, rid)]
    held = sum(len(e.tokens) for e in events if isinstance(e, TokensEvent))
    end = events[-1]
    assert isinstance(end, DoneEvent) and end.finish_reason == "cancelled"
    assert end.usage.completion_tokens == held == stopped["completion_tokens"]


async def no_running(redis: Redis) -> bool:
    return int(await redis.zcard(keys.running("mock"))) == 0


@pytest.mark.slow
async def test_a_fenced_worker_stops_and_writes_nothing_after_losing_its_lease(
    start_api: StartApi, spawn_workers: SpawnWorkers, redis: Redis
) -> None:
    """SIGSTOP the worker mid-stream past its lease: the request re-runs elsewhere.
    SIGCONT: the old worker's pending and later writes are refused, it stops the
    generation, and the client's text equals an undisturbed run."""
    procs = await spawn_workers(2, concurrency=1, model_tokens_per_second=50, lease_seconds=1)
    api = await start_api()
    max_tokens = 100
    expected = await undisturbed(max_tokens, SEED)
    async with api.client() as c:
        await wait_ready(c)
        rid = await post_request(c, "fence me", max_tokens=max_tokens, seed=SEED)
        native = NativeReader(c, rid, after_tokens=10)
        await asyncio.wait_for(native.seen.wait(), timeout=20)
        owner = (await record(c, rid))["worker"]
        victim = next(p for p in procs if f"-{p.pid}-" in owner)
        victim.signal(signal.SIGSTOP)
        try:

            async def rerun() -> bool:
                return int((await record(c, rid))["attempts"]) == 2

            await wait_until(rerun, timeout=10, what="the re-run to start")
            await wait_until(
                lambda: len(native.tokens) >= 30, timeout=10, what="the re-run's tokens"
            )
        finally:
            victim.signal(signal.SIGCONT)
        await asyncio.wait_for(native.task, timeout=20)
        final = await record(c, rid)
    assert native.tokens == expected and native.last["type"] == "done"
    assert final["attempts"] == 2 and final["worker"] != owner
    await check_redis_after(redis, rid, max_tokens)
    events = [e for _, e in await stream_events(redis, rid)]
    started = [(e.worker, e.attempt) for e in events if isinstance(e, StartedEvent)]
    assert started == [(owner, 1), (final["worker"], 2)]
    # the lifecycle: nothing from the old worker once the re-run started
    notes = [json.loads(f["data"]) for _, f in await redis.xrange(keys.lifecycle(rid))]
    mine = [n for n in notes if n["request_id"] == rid]
    rerun_at = next(i for i, n in enumerate(mine) if n.get("attempt") == 2)
    assert not [n for n in mine[rerun_at:] if n.get("worker") == owner], mine
    assert [n["event"] for n in mine].count("finished") == 1

    def told() -> bool:
        return "lost its lease" in victim.output() or "fenced off" in victim.output()

    await wait_until(told, timeout=5, what="the old worker to learn it was fenced")


@pytest.mark.slow
async def test_an_idle_stack_logs_no_warning(spawn_workers: SpawnWorkers, redis_url: str) -> None:
    """With a 0.5 s socket timeout, several times over: no connection drops on idle."""
    settings = {"redis_socket_timeout_seconds": 0.5}
    (worker,) = await spawn_workers(1, **settings)
    port = free_port()
    api = Proc(
        ["api"],
        clean_env(
            LLMQ_REDIS_URL=redis_url,
            LLMQ_PORT=str(port),
            LLMQ_REDIS_SOCKET_TIMEOUT_SECONDS="0.5",
            LLMQ_RELAY_BLOCK_MS="1000",
        ),
    )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as c:
            await wait_ready(c, timeout=30)
            rid = await post_request(c, "one request, then idle", max_tokens=3)
            await wait_status(c, rid, "done")
            await asyncio.sleep(3.0)  # the idle period under test: 6 socket timeouts
            assert (await c.get("/readyz")).status_code == 200
    finally:
        api.stop()
    for proc in (worker, api):
        lines = [line for line in proc.output().splitlines() if "WARNING" in line]
        assert not lines, lines
