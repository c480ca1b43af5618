"""Every script call keeps to one hash slot: what lets llmq run on a Redis Cluster.

A whole pipeline runs against a real Redis (API, two worker processes): hand-offs,
a claim, runs, a cancel while queued and one while running, a deadline sweep, a
worker SIGKILLed mid-stream (reaped, fenced, resumed by the other) and one stopped
with a request in hand (requeued). ``MONITOR`` records every command Redis ran;
each EVALSHA's keys, and the key prefixes its arguments name (keys the script
builds), must hash to one slot, as must every multi-key command. A key moved back
to a global name (one deadline set for all models, one lifecycle stream) fails it.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from redis.asyncio import Redis
from redis.crc import key_slot

from llmq.protocol import keys, scripts
from tests.support.native import post_request, record, wait_ready, wait_status
from tests.support.servers import SpawnWorkers, StartApi
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(90)

_ARG = re.compile(rb'"((?:[^"\\]|\\.)*)"')

#: Commands whose every argument after the name is a key.
MULTI_KEY = {b"DEL", b"UNLINK", b"MGET", b"EXISTS"}


@dataclass
class Monitor:
    """Every command Redis runs, as argument lists (arguments escaped as MONITOR shows)."""

    commands: list[list[bytes]] = field(default_factory=list)

    def scripts(self) -> list[tuple[str, list[bytes], list[bytes]]]:
        """(script name, KEYS, ARGV) of every EVALSHA."""
        names = {
            hashlib.sha1(scripts.source(n).encode()).hexdigest().encode(): n for n in scripts.NAMES
        }
        out = []
        for args in self.commands:
            if args[0].upper() == b"EVALSHA":
                n = int(args[2])
                out.append((names.get(args[1], args[1].decode()), args[3 : 3 + n], args[3 + n :]))
        return out


@pytest.fixture
async def monitor(redis: Redis) -> AsyncIterator[Monitor]:
    found = Monitor()
    conn = redis.connection_pool.make_connection()  # type: ignore[no-untyped-call]
    await conn.connect()
    await conn.send_command("MONITOR")
    assert await conn.read_response(disable_decoding=True) == b"OK"

    async def read() -> None:
        while True:
            line = await conn.read_response(disable_decoding=True)
            if isinstance(line, bytes) and b"] " in line and b" lua]" not in line:
                found.commands.append(_ARG.findall(line.split(b"] ", 1)[1]))

    task = asyncio.create_task(read())
    yield found
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await conn.disconnect()


def named_keys(args: list[bytes]) -> list[bytes]:
    """Arguments that name a tagged llmq or arq key or key prefix."""
    return [a for a in args if a.startswith((b"llmq:", b"arq:")) and b"{" in a]


@pytest.mark.slow
async def test_every_script_call_keeps_to_one_slot(
    start_api: StartApi, spawn_workers: SpawnWorkers, redis: Redis, monitor: Monitor
) -> None:
    procs = await spawn_workers(
        2, concurrency=1, model_tokens_per_second=60, lease_seconds=1, drain_seconds=0
    )
    api = await start_api(sweep_seconds=0.1)
    async with api.client() as client:
        await wait_ready(client)
        long = {"max_tokens": 80, "seed": 7}
        # two hand-offs: each parked worker is handed one
        first = await post_request(client, "one", **long)
        second = await post_request(client, "two", **long)
        await wait_status(client, first, "running")
        await wait_status(client, second, "running")
        # both busy: these wait; one is cancelled, the other's deadline passes
        cancelled = await post_request(client, "three")
        late = await post_request(client, "four", queue_timeout=0.3)
        assert (await client.delete(f"/v1/requests/{cancelled}")).status_code == 200
        await wait_status(client, late, "failed", timeout=10)
        # a running one is cancelled: its worker frees and parks
        assert (await client.delete(f"/v1/requests/{second}")).status_code == 200
        await wait_status(client, second, "cancelled", timeout=10)
        # the other worker dies mid-stream: reaped, fenced, claimed and resumed
        victim_id = (await record(client, first))["worker"]
        victim = next(p for p in procs if f"-{p.pid}-" in victim_id)
        victim.signal(signal.SIGKILL)
        done = await wait_status(client, first, "done", timeout=30)
        assert done["attempts"] == 2 and done["completion_tokens"] == 80
        # the survivor stops with a request in hand: handed back to the queue
        last = await post_request(client, "five", **long)
        await wait_status(client, last, "running")
        survivor = next(p for p in procs if p is not victim)
        survivor.signal(signal.SIGTERM)

        async def requeued() -> bool:
            return await redis.zscore(keys.queue("mock"), last) is not None

        await wait_until(requeued, timeout=20, what="the request to be handed back")

    calls = monitor.scripts()
    seen = {name for name, _, _ in calls}
    expected = {"record", "enqueue", "claim", "renew", "publish", "release", "cancel"}
    expected |= {"sweep", "reap", "fence", "requeue", "api_beat", "worker_beat"}
    expected |= {"metrics_flush"}  # each process's flush, every second
    assert expected <= seen, f"never ran: {expected - seen}"
    for name, script_keys, argv in calls:
        if name == "publish":
            # On a single Redis one call carries a flush; per request (four keys) one
            # slot, and on a cluster one call per group (tests/test_cluster.py runs it).
            groups = [script_keys[i : i + 4] for i in range(0, len(script_keys), 4)]
        else:
            groups = [script_keys + named_keys(argv)]
        for named in groups:
            slots = {key_slot(k) for k in named}
            assert len(slots) == 1, f"{name} spans slots: {named}"
    for args in monitor.commands:
        if args[0].upper() in MULTI_KEY and len(args) > 2:
            slots = {key_slot(k) for k in args[1:]}
            assert len(slots) == 1, f"{args[0].decode()} spans slots: {args[1:]}"
