"""Redis faults: restarts, stalls, a dropped subscription, a killed worker, a full CPU.

One stack (Redis with AOF, one API, two workers, default lease settings) takes each
fault ``reps`` times while clients stream: two native clients (every event carries
its index, so a lost or repeated token is counted exactly) and one OpenAI client
(which must end with ``finish_reason: length``, never ``cancelled``). Per fault:

* client stall: the longest gap between two token arrivals of a stream (it includes
  the fault itself), and from the end of the fault to the next new token;
* tokens lost (indices a client never got), duplicated (indices a client got twice,
  and indices the Redis stream holds twice);
* stuck: streams without their terminal event 30 s after the fault, or requests
  still running or queued afterwards; a ``done`` whose count is not what came;
* false reaps: re-runs of requests whose worker was alive (attempts > 1; after a
  worker SIGKILL, > 2).

Faults: Redis SIGTERM + restart on the same port and directory (1 s down); a stall
(``DEBUG SLEEP``, 10 s: ten leases); SIGSTOP of Redis for 5 s; a worker SIGKILLed
mid-stream (a replacement is started afterwards); the workers' pub/sub connections
killed (three times, so the listener stays away) and a ``DELETE`` sent meanwhile
(time until the request is cancelled); two busy loops holding both cores while
streams run. With nothing at fault, a ``DELETE`` of a running request: the time
until it is cancelled and the tokens written after the ``DELETE`` was answered (the
figure the tests count in tokens, ``tests/test_cancel_latency.py``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from redis.asyncio import Redis

from bench.procs import BenchError, Stack
from bench.report import fmt, table, target_line
from bench.scenario import Context, ScenarioResult, Target
from bench.stats import median
from llmq.embedded import EmbeddedRedis
from llmq.model.interface import GenerationRequest
from llmq.protocol import keys
from llmq.protocol.streams import published_tokens
from llmq.settings import WorkerSettings
from loadgen.sse import DONE, frames
from worker.mock import MockBackend

TOKENS_PER_SECOND = 50.0
MAX_TOKENS = 60
STUCK_AFTER_S = 30.0
FAULTS = ("redis-restart", "debug-sleep-10s", "sigstop-5s", "worker-sigkill", "full-cpu")


@dataclass
class Client:
    """One stream: what arrived and when (``time.monotonic()``)."""

    rid: str = ""
    indices: list[int] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    text: str = ""
    end: dict[str, Any] | None = None
    finish_reason: str | None = None
    error: str | None = None


async def _native(c: httpx.AsyncClient, client: Client) -> None:
    try:
        async with c.stream("GET", f"/v1/requests/{client.rid}/events") as r:
            async for frame in frames(r.aiter_bytes()):
                event = frame.json()
                if event["type"] == "tokens":
                    now = time.monotonic()
                    for i, token in enumerate(event["tokens"]):
                        client.indices.append(event["index"] + i)
                        client.arrivals.append(now)
                        client.text += token
                elif event["type"] in ("done", "error"):
                    client.end = event
                    return
    except (httpx.HTTPError, ValueError) as exc:
        client.error = f"{type(exc).__name__}: {exc}"


async def _openai(c: httpx.AsyncClient, client: Client, prompt: str, seed: int) -> None:
    body = {"model": "mock", "prompt": prompt, "max_tokens": MAX_TOKENS, "seed": seed}
    try:
        async with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            async for frame in frames(r.aiter_bytes()):
                if frame.data == DONE:
                    continue
                chunk = frame.json()
                if "error" in chunk:
                    client.error = json.dumps(chunk["error"])[:200]
                    continue
                client.rid = str(chunk["id"]).split("-", 1)[1]
                for choice in chunk.get("choices") or []:
                    client.text += choice.get("text") or ""
                    client.finish_reason = choice.get("finish_reason") or client.finish_reason
    except (httpx.HTTPError, ValueError) as exc:
        client.error = f"{type(exc).__name__}: {exc}"


async def _expected(prompt: str, seed: int) -> list[str]:
    model = MockBackend(tokens_per_second=1e9, prefill_seconds_per_token=0.0)
    request = GenerationRequest(prompt=prompt, max_tokens=MAX_TOKENS, seed=seed, prompt_tokens=0)
    return [token async for token in model.generate(request) if isinstance(token, str)]


async def _poll(condition: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            raise BenchError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def _stream_duplicates(redis: Redis, rid: str) -> int:
    seen: set[int] = set()
    dup = 0
    for _, fields in await redis.xrange(keys.stream(rid)):
        event = json.loads(fields["data"])
        if event.get("type") == "tokens":
            for i in range(len(event["tokens"])):
                dup += (event["index"] + i) in seen
                seen.add(event["index"] + i)
    return dup


async def _one_rep(
    stack: Stack, redis_url: str, fault: str, rep: int, inject: Injector
) -> dict[str, Any]:
    """Start three streams, inject the fault once they are under way, measure."""
    seed = 1000 + rep
    prompt = f"fault {fault} {rep}"
    expected = await _expected(prompt, seed)
    redis = Redis.from_url(redis_url, decode_responses=True, socket_timeout=30)
    async with httpx.AsyncClient(base_url=stack.url, timeout=60) as c:
        natives = []
        for _ in range(2):
            r = await c.post(
                "/v1/requests",
                json={"model": "mock", "prompt": prompt, "max_tokens": MAX_TOKENS, "seed": seed},
            )
            if r.status_code != 202:
                raise BenchError(f"submit answered {r.status_code}: {r.text[:200]}")
            natives.append(Client(rid=r.json()["id"]))
        openai = Client()
        tasks = [asyncio.create_task(_native(c, n)) for n in natives]
        tasks.append(asyncio.create_task(_openai(c, openai, prompt, seed)))

        async def under_way() -> bool:
            return all(len(n.indices) >= 10 for n in natives)

        await _poll(under_way, 30, "the streams to get going")
        fault_at = time.monotonic()
        back_at = await inject(c, [n.rid for n in natives])
        done, _ = await asyncio.wait(tasks, timeout=STUCK_AFTER_S)
        stuck = len(tasks) - len(done)
        for task in tasks:
            task.cancel()
        attempts = []
        for client in [*natives, openai]:
            if client.rid:
                found = await redis.hget(keys.request(client.rid), "attempts")
                attempts.append(int(found or 0))

        async def settled() -> bool:
            return int(await redis.zcard(keys.running("mock"))) == 0

        try:
            await _poll(settled, 10, "nothing running")
        except BenchError:
            stuck += int(await redis.zcard(keys.running("mock")))
        stuck += int(await redis.zcard(keys.queue("mock")))
        stream_dup = sum([await _stream_duplicates(redis, n.rid) for n in natives])
    await redis.aclose()
    lost = dup = mismatched = 0
    gaps, after_back = [], []
    for n in natives:
        got = set(n.indices)
        lost += sum(1 for i in range(MAX_TOKENS) if i not in got)
        dup += len(n.indices) - len(got)
        if n.end is None or (n.end.get("usage") or {}).get("completion_tokens") != len(got):
            mismatched += 1
        if n.text != "".join(expected[: len(n.text)]) and not lost:
            mismatched += 1
        times = [fault_at, *[t for t in n.arrivals if t >= fault_at]]
        gaps.append(max((b - a for a, b in itertools.pairwise(times)), default=0.0))
        later = [t for t in n.arrivals if t >= back_at]
        if later:
            after_back.append(later[0] - back_at)
    reruns_allowed = 2 if fault == "worker-sigkill" else 1
    return {
        "stall_s": max(gaps, default=None),
        "after_back_s": max(after_back, default=None),
        "lost": lost,
        "duplicated_client": dup,
        "duplicated_stream": stream_dup,
        "stuck": stuck,
        "count_mismatch": mismatched,
        "openai_not_length": int(openai.finish_reason != "length" or openai.error is not None),
        "openai_text_ok": openai.text == "".join(expected),
        "false_reaps": sum(1 for a in attempts if a > reruns_allowed),
    }


async def _cancel_rep(stack: Stack, redis_url: str, drop_pubsub: bool) -> dict[str, Any]:
    """DELETE a running request; with ``drop_pubsub``, after killing the workers' pub/sub
    connections three times (the cancel message is lost)."""
    redis = Redis.from_url(redis_url, decode_responses=True)
    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as c:
        body = {"model": "mock", "prompt": "cancel me", "max_tokens": 1000}
        rid = (await c.post("/v1/requests", json=body)).json()["id"]

        async def running() -> bool:
            status: str = (await c.get(f"/v1/requests/{rid}")).json()["status"]
            return status == "running"

        await _poll(running, 30, "the request to run")
        for _ in range(3 if drop_pubsub else 0):

            async def subscribed() -> bool:
                return len(await redis.client_list(_type="pubsub")) >= 2

            await _poll(subscribed, 10, "the listeners to subscribe")
            await redis.client_kill_filter(_type="pubsub")
        t0 = time.monotonic()
        await c.delete(f"/v1/requests/{rid}")
        before = len(await published_tokens(redis, rid))
        missed = len(await redis.client_list(_type="pubsub")) < 2

        async def cancelled() -> bool:
            status: str = (await c.get(f"/v1/requests/{rid}")).json()["status"]
            return status in ("cancelled", "done", "failed")

        stuck = 0
        try:
            await _poll(cancelled, STUCK_AFTER_S, "the cancel")
        except BenchError:
            stuck = 1
        took = time.monotonic() - t0
        final = (await c.get(f"/v1/requests/{rid}")).json()
        status = final["status"]
    await redis.aclose()
    return {
        "cancel_s": took,
        "tokens_after": final["completion_tokens"] - before,
        "missed_message": missed,
        "stuck": stuck,
        "not_cancelled": int(status != "cancelled"),
    }


#: Injects a fault into the stack, given the API client and the native streams' ids;
#: returns when the fault is over (Redis back, the worker dead).
Injector = Callable[[httpx.AsyncClient, list[str]], Awaitable[float]]


def _injector(stack: Stack, fault: str, redis_url: str) -> Injector:
    server = stack.redis

    async def restart(c: httpx.AsyncClient, rids: list[str]) -> float:
        await asyncio.to_thread(server.stop, remove=False)
        await asyncio.sleep(1.0)  # the outage
        await asyncio.to_thread(server.start)
        return time.monotonic()

    async def debug_sleep(c: httpx.AsyncClient, rids: list[str]) -> float:
        sleeper = Redis.from_url(redis_url, socket_timeout=30)
        await sleeper.execute_command("DEBUG", "SLEEP", 10)
        await sleeper.aclose()
        return time.monotonic()

    async def sigstop(c: httpx.AsyncClient, rids: list[str]) -> float:
        assert server.process is not None
        server.process.send_signal(signal.SIGSTOP)
        await asyncio.sleep(5.0)  # the stall
        server.process.send_signal(signal.SIGCONT)
        return time.monotonic()

    async def sigkill(c: httpx.AsyncClient, rids: list[str]) -> float:
        owner = (await c.get(f"/v1/requests/{rids[0]}")).json()["worker"]
        victim = next(w for w in stack.workers if f"-{w.pid}-" in owner)
        victim.popen.kill()
        victim.popen.wait()
        return time.monotonic()

    async def full_cpu(c: httpx.AsyncClient, rids: list[str]) -> float:
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
        try:
            await asyncio.sleep(MAX_TOKENS / TOKENS_PER_SECOND)
        finally:
            for hog in hogs:
                hog.kill()
                hog.wait()
        return time.monotonic()

    return {
        "redis-restart": restart,
        "debug-sleep-10s": debug_sleep,
        "sigstop-5s": sigstop,
        "worker-sigkill": sigkill,
        "full-cpu": full_cpu,
    }[fault]


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"reps": len(runs)}
    for key in ("stall_s", "after_back_s", "cancel_s", "tokens_after"):
        values = [r[key] for r in runs if r.get(key) is not None]
        if values:
            out[f"{key}_median"] = median(values)
            out[f"{key}_max"] = max(values)
    for key in (
        "lost",
        "duplicated_client",
        "duplicated_stream",
        "stuck",
        "count_mismatch",
        "openai_not_length",
        "false_reaps",
        "not_cancelled",
        "missed_message",
    ):
        if any(key in r for r in runs):
            out[key] = sum(int(r.get(key, 0)) for r in runs)
    return out


def run(ctx: Context) -> ScenarioResult:
    reps = 2 if ctx.quick else 20
    worker_env = {
        "LLMQ_CONCURRENCY": "8",
        "LLMQ_MODEL_TOKENS_PER_SECOND": str(TOKENS_PER_SECOND),
    }
    stack = Stack(ctx.log_dir)
    stack.redis = EmbeddedRedis(appendonly=True, extra_args=("--enable-debug-command", "local"))
    results: dict[str, dict[str, Any]] = {}
    with stack:
        stack.scale(2, worker_env)
        for fault in FAULTS:
            ctx.say(f"  fault {fault} x{reps}")
            runs = []
            for rep in range(reps):
                inject = _injector(stack, fault, stack.redis.url)
                runs.append(asyncio.run(_one_rep(stack, stack.redis.url, fault, rep, inject)))
                if fault == "worker-sigkill":
                    stack.workers = [w for w in stack.workers if w.running()]
                    stack.scale(2)
            results[fault] = _summary(runs)
        ctx.say(f"  cancel x{reps}")
        cancels = [asyncio.run(_cancel_rep(stack, stack.redis.url, False)) for _ in range(reps)]
        results["cancel"] = _summary(cancels)
        ctx.say(f"  fault pubsub-drop+cancel x{reps}")
        cancels = [asyncio.run(_cancel_rep(stack, stack.redis.url, True)) for _ in range(reps)]
        results["pubsub-drop+cancel"] = _summary(cancels)
    return _result(results)


def _result(results: dict[str, dict[str, Any]]) -> ScenarioResult:
    defaults = WorkerSettings.model_fields
    rows = []
    for fault, r in results.items():
        stall = (
            f"{fmt(r.get('stall_s_median'), 2)} / {fmt(r.get('stall_s_max'), 2)}"
            if "stall_s_median" in r
            else f"cancel {fmt(r.get('cancel_s_median'), 2)} / {fmt(r.get('cancel_s_max'), 2)}"
            f" ({fmt(r.get('tokens_after_median'), 0)} / {fmt(r.get('tokens_after_max'), 0)}"
            " tokens after)"
        )
        rows.append(
            [
                fault,
                str(r["reps"]),
                stall,
                f"{fmt(r.get('after_back_s_median'), 2)} / {fmt(r.get('after_back_s_max'), 2)}",
                str(r.get("lost", "—")),
                f"{r.get('duplicated_client', '—')} / {r.get('duplicated_stream', '—')}",
                str(r.get("stuck", 0)),
                str(r.get("false_reaps", "—")),
                str(r.get("openai_not_length", r.get("not_cancelled", "—"))),
            ]
        )
    bad = sum(
        int(r.get(k, 0))
        for r in results.values()
        for k in ("lost", "duplicated_client", "stuck", "false_reaps", "count_mismatch")
    )
    false_reaps = sum(int(r.get("false_reaps", 0)) for r in results.values())
    kill = results.get("worker-sigkill", {})
    targets = [
        Target("no token lost or repeated, nothing stuck, counts match", bad == 0, f"{bad} bad"),
        Target(
            "zero false reaps (stalls up to 10 s, full CPU)", false_reaps == 0, str(false_reaps)
        ),
        Target(
            "worker SIGKILL -> next token <= 1.5 s (median)",
            (kill.get("stall_s_median") or 99) <= 1.5,
            f"{fmt(kill.get('stall_s_median'), 2)} s",
        ),
    ]
    md = "\n".join(
        [
            f"Lease {defaults['lease_seconds'].default} s, heartbeat "
            f"{defaults['heartbeat_seconds'].default} s, sweep {defaults['sweep_seconds'].default}"
            f" s; streams of {MAX_TOKENS} tokens at {TOKENS_PER_SECOND:g} tokens/s, two native "
            "and one OpenAI client per repetition.",
            "",
            table(
                [
                    "fault",
                    "reps",
                    "client stall median / max (s)",
                    "Redis back → next token median / max (s)",
                    "tokens lost",
                    "duplicated client / stream",
                    "stuck",
                    "false reaps",
                    "OpenAI not `length` / not cancelled",
                ],
                rows,
            ),
            "",
            *(target_line(t.description, t.met, t.detail) for t in targets),
        ]
    )
    return ScenarioResult("redis-faults", "Redis and worker faults", results, md, targets)
