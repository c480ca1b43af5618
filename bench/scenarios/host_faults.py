"""Faults on the many-host cluster, one at a time, for the ``multihost`` scenario.

Each fault runs streams through an API host, injects the fault, and returns what
the clients saw (stall; tokens lost or duplicated against the mock model's output
for the seed) and what Redis holds afterwards (indices stored twice or missing).
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import itertools
import json
import re
import time
from typing import Any

import httpx
from redis.asyncio import Redis

from bench.scenarios.recovery import Sizes as StreamSizes
from bench.scenarios.recovery import Stream, _consume, _expected_text
from llmq.connection import connect
from llmq.protocol import keys
from llmq.settings import CommonSettings
from rigs.hosts import Stack
from rigs.netns import REDIS_PORT, SENTINEL_MASTER, SENTINEL_PORT


async def _stream_check(redis: Redis, stream: Stream, expected: str, tokens: int) -> dict[str, Any]:
    """Tokens lost and duplicated at the client, and indices doubled or missing in Redis."""
    got, want = stream.text.split(" "), expected.split(" ")
    lost = dup = 0
    for op, a1, a2, b1, b2 in difflib.SequenceMatcher(a=want, b=got, autojunk=False).get_opcodes():
        if op in ("delete", "replace"):
            lost += a2 - a1
        if op in ("insert", "replace"):
            dup += b2 - b1
    indices: list[int] = []
    if stream.request_id:
        for _, fields in await redis.xrange(keys.stream(stream.request_id)):
            event = json.loads(fields["data"])
            if event.get("type") == "tokens":
                indices.extend(range(event["index"], event["index"] + len(event["tokens"])))
    return {
        "client_lost": lost,
        "client_duplicated": dup,
        "finished": stream.done and stream.error is None,
        "stored_duplicates": len(indices) - len(set(indices)),
        "stored_missing": tokens - len(set(indices)),
    }


def _longest_pause(stream: Stream, since: float) -> float | None:
    """The client's longest wait for a chunk after the fault at ``since`` (monotonic s).

    Chunks written before the fault can still arrive just after it; a pause measured
    from each arrival (not from the first one after the fault) is not fooled by them.
    """
    times = [since, *(t for t, _, _ in stream.chunks if t > since)]
    if len(times) < 2:
        return None
    return max(b - a for a, b in itertools.pairwise(times))


async def _run_streams(
    url: str, streams: list[Stream], sizes: StreamSizes, timeout: float
) -> list[asyncio.Task[None]]:
    client = httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(60.0, connect=5.0))
    tasks = [asyncio.create_task(_consume(client, sizes, st)) for st in streams]

    async def close_later() -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait(tasks, timeout=timeout)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.aclose()

    closer = asyncio.create_task(close_later())
    return [*tasks, closer]


async def _until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def _redis(stack: Stack) -> Redis:
    env = stack.redis_env()
    settings = CommonSettings(
        redis_url=env["LLMQ_REDIS_URL"], redis_sentinels=env.get("LLMQ_REDIS_SENTINELS", "")
    )
    return connect(settings, max_connections=4)


async def partition(stack: Stack, i: int, tokens: int, tokens_per_second: float) -> dict[str, Any]:
    """One stream; cut the link of its worker's host after 20 tokens; heal once it ended."""
    sizes = StreamSizes(max_tokens=tokens, tokens_per_second=tokens_per_second)
    stream = Stream(0, seed=5000 + i, prompt=f"partition {i}")
    tasks = await _run_streams(stack.api_url("api2"), [stream], sizes, timeout=60)
    redis = _redis(stack)
    http = httpx.AsyncClient(base_url=stack.api_url("api2"), timeout=5)
    host: str | None = None
    try:

        async def flowing() -> bool:
            return stream.received >= 20 and stream.request_id is not None

        await _until(flowing, 30, "20 tokens")
        at_start = (await http.get(f"/v1/requests/{stream.request_id}")).json()
        host = stack.worker_host(str(at_start["worker"]))
        assert host is not None
        cut_mono = time.monotonic()
        stack.cluster.cut(host)
        await asyncio.wait(tasks[:-1], timeout=60)
    finally:
        if host is not None:
            stack.cluster.heal(host)
    expected = await _expected_text(sizes, stream)
    out = await _stream_check(redis, stream, expected, tokens)
    record = (await http.get(f"/v1/requests/{stream.request_id}")).json()

    async def rejoined() -> bool:
        r = await http.get("/v1/workers")
        return r.status_code == 200 and len(r.json()["data"]) == len(stack.workers)

    with contextlib.suppress(TimeoutError):  # a worker still away shows in the next fault
        await _until(rejoined, 15, "the healed worker to rejoin")
    await tasks[-1]
    await http.aclose()
    await redis.aclose(close_connection_pool=True)
    return {
        **out,
        "host": host,
        "stall_s": _longest_pause(stream, cut_mono),
        "attempts_at_cut": at_start.get("attempts"),
        "attempts": record.get("attempts"),
        # the cut hit the attempt that was running (it re-ran elsewhere)
        "rerun": (record.get("attempts") or 0) > (at_start.get("attempts") or 0),
    }


async def _primary(stack: Stack) -> str:
    for host in ("redis1", "redis2", "redis3"):
        sentinel = Redis(
            host=stack.cluster.hosts[host].address, port=SENTINEL_PORT, socket_timeout=1
        )
        try:
            found = await sentinel.sentinel_get_master_addr_by_name(SENTINEL_MASTER)  # type: ignore[no-untyped-call]
            address = found[0].decode() if isinstance(found[0], bytes) else str(found[0])
            return next(n for n, h in stack.cluster.hosts.items() if h.address == address)
        except Exception:
            continue
        finally:
            await sentinel.aclose()
    raise RuntimeError("no Sentinel answers")


async def _replica_ready(stack: Stack, host: str) -> bool:
    """``host`` replicates the primary and every Sentinel lists it as a healthy replica."""
    try:
        node = Redis(
            host=stack.cluster.hosts[host].address, port=REDIS_PORT, password=stack.cluster.password
        )
        info = await node.info("replication")
        await node.aclose()
        if info.get("master_link_status") != "up":
            return False
        for sentinel_host in ("redis1", "redis2", "redis3"):
            sentinel = Redis(host=stack.cluster.hosts[sentinel_host].address, port=SENTINEL_PORT)
            replicas = await sentinel.sentinel_slaves(SENTINEL_MASTER)  # type: ignore[no-untyped-call]
            await sentinel.aclose()
            address = stack.cluster.hosts[host].address
            if not any(r["ip"] == address and not r["is_sdown"] for r in replicas):
                return False
    except Exception:
        return False
    return True


async def _submit(url: str, stop: asyncio.Event, accepted: list[str]) -> int:
    refused = 0
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        while not stop.is_set():
            body = {"model": "mock", "prompt": "ack", "max_tokens": 2}
            try:
                r = await http.post("/v1/requests", json=body)
                if r.status_code == 202:
                    accepted.append(r.json()["id"])
                else:
                    refused += 1
            except httpx.HTTPError:
                refused += 1
            await asyncio.sleep(0.05)
    return refused


#: A Sentinel event in its log (``... # +elected-leader master llmq ...``): the
#: steps of a failover, and what delays one (``+tilt``, ``-failover-abort-...``).
_SENTINEL_EVENT = re.compile(r" [#*] ([+-][a-z][a-z-]*)")


def _sentinel_events(stack: Stack, marks: dict[str, int]) -> dict[str, list[str]]:
    """What each Sentinel logged since ``marks`` (its log's size then), events only."""
    events = {}
    for host, process in stack.sentinels.items():
        with process.log.open("rb") as f:
            f.seek(marks[host])
            text = f.read().decode(errors="replace")
        events[host] = _SENTINEL_EVENT.findall(text)
    return events


async def failover(
    stack: Stack, i: int, count: int, tokens: int, tokens_per_second: float
) -> dict[str, Any]:
    """``count`` streams; SIGKILL the primary; restart it as a replica once a new one is named."""
    sizes = StreamSizes(max_tokens=tokens, tokens_per_second=tokens_per_second)
    streams = [Stream(n, seed=9000 + 10 * i + n, prompt=f"failover {i}") for n in range(count)]
    tasks = await _run_streams(stack.api_url("api2"), streams, sizes, timeout=20)
    primary = await _primary(stack)

    async def flowing() -> bool:
        return all(st.received >= 20 for st in streams)

    await _until(flowing, 30, "20 tokens per stream")
    stop = asyncio.Event()
    acked: list[str] = []
    plain: list[str] = []
    submitters = [
        asyncio.create_task(_submit(stack.api_url("api1"), stop, acked)),
        asyncio.create_task(_submit(stack.api_url("api2"), stop, plain)),
    ]
    await asyncio.sleep(0.5)  # submissions before the kill
    marks = {host: p.log.stat().st_size for host, p in stack.sentinels.items()}
    stack.redis[primary].kill()
    kill_mono = time.monotonic()

    async def switched() -> bool:
        return await _primary(stack) != primary

    await _until(switched, 30, "the Sentinels to promote a replica")
    failover_s = time.monotonic() - kill_mono
    sentinel_events = _sentinel_events(stack, marks)
    await asyncio.sleep(1.0)  # submissions after the switch
    stop.set()
    await asyncio.gather(*submitters)
    await tasks[-1]
    new_primary = await _primary(stack)
    stack.redis[primary] = stack.cluster.start_redis(primary, replica_of=new_primary)
    redis = _redis(stack)
    checks = []
    for st in streams:
        check = await _stream_check(redis, st, await _expected_text(sizes, st), tokens)
        stall = _longest_pause(st, kill_mono)
        # what the client waited beyond the failover itself: llmq's part of the stall
        beyond = None if stall is None else stall - failover_s
        checks.append({**check, "stall_s": stall, "beyond_failover_s": beyond})
    missing = {}
    for name, ids in (("acked", acked), ("plain", plain)):
        missing[name] = sum([not await redis.exists(keys.request(rid)) for rid in ids])
    await redis.aclose(close_connection_pool=True)
    with contextlib.suppress(TimeoutError):
        await _until(lambda: _replica_ready(stack, primary), 30, "the old primary to replicate")
    return {
        "killed": primary,
        "failover_s": failover_s,
        "sentinel_events": sentinel_events,
        "streams": checks,
        "accepted": {"acked": len(acked), "plain": len(plain)},
        "missing": missing,
    }
