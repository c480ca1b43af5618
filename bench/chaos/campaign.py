"""One campaign: the stack on network-namespace hosts, clients and the nemesis for
``duration`` seconds, then the faults healed, the system left to settle, and the
whole history checked.

The stack: Redis with its append-only file (primary, replica, three Sentinels),
two API hosts, three worker hosts and the client side in the root namespace
(which reaches every host over the bridge). Clients arrive as a Poisson process
drawn from the seed: half native, half OpenAI streams, a share cancelling at a
random moment, each asking ``max_tokens`` with ``ignore_eos`` so that the
expected text is exactly that many tokens of the mock for its seed
(:func:`reference`); and a batch of such lines through the Batch API
(:mod:`bench.chaos.batch`), made before the faults start.
"""

from __future__ import annotations

import asyncio
import random
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from redis.asyncio import Redis

from bench.chaos import batch
from bench.chaos.checker import TERMINAL, Violation, check
from bench.chaos.clients import Clients
from bench.chaos.history import History, Kind, Process, Request, Spec, to_json
from bench.chaos.nemesis import KINDS, Nemesis, Rig
from bench.scenarios.host_faults import _redis
from llmq.metrics import FLUSH_SECONDS
from llmq.model.interface import GenerationRequest
from llmq.protocol import keys
from llmq.settings import WorkerSettings
from rigs.hosts import API_HOSTS, start_stack
from rigs.netns import Cluster
from worker.mock import MockBackend

MODEL = "mock"
WORKER: dict[str, Any] = {
    "model_tokens_per_second": 40,
    "model_stop_probability": 0.0,
    "heartbeat_seconds": 0.5,
    "lease_seconds": 2.0,
    "concurrency": 4,
    "drain_seconds": 2,
}
API: dict[str, Any] = {"sse_keepalive_seconds": 1.0}
#: A Redis pause or sleep (at most 3 s) is not a failover; SENTINEL FAILOVER is.
DOWN_AFTER_MS = 5000


@dataclass(frozen=True)
class Plan:
    """A campaign's sizes; the seed draws everything else."""

    seed: int
    duration: float
    arrivals_per_second: float = 1.5
    max_tokens: tuple[int, int] = (10, 150)
    openai_share: float = 0.5
    cancel_share: float = 0.2
    #: Every request must have ended this long after the faults stopped.
    bound: float = 60.0
    #: The workers' ``lease_self_expiry`` (off: to measure what it saves).
    self_expiry: bool = True
    #: Fault kinds to draw from, by name (empty: every one).
    kinds: tuple[str, ...] = ()
    #: Lines of the batch run beside the clients (0: none).
    batch_lines: int = 30


def replay_command(plan: Plan) -> str:
    return f"python -m bench --scenarios chaos --seed {plan.seed} --duration {plan.duration:g}"


async def reference(spec: Spec) -> list[str]:
    """The tokens of an undisturbed run: the mock for the seed, without its waits, with
    the workers' chance to stop (its draws shape the tokens even under ``ignore_eos``)."""
    stop = WorkerSettings(**WORKER).mock_stop_probability()
    model = MockBackend(tokens_per_second=1e9, prefill_seconds_per_token=0.0, stop_probability=stop)
    request = GenerationRequest(
        prompt=spec.prompt,
        max_tokens=spec.max_tokens,
        seed=spec.seed,
        prompt_tokens=0,
        ignore_eos=True,
    )
    return [str(token) async for token in model.generate(request) if isinstance(token, str)]


def specs(plan: Plan) -> list[tuple[float, Spec]]:
    """Every request of the campaign, with its arrival time (seconds), from the seed."""
    rng = random.Random(f"clients:{plan.seed}")
    at, out = 0.0, list[tuple[float, Spec]]()
    while True:
        at += rng.expovariate(plan.arrivals_per_second)
        if at >= plan.duration:
            return out
        n = len(out)
        kind: Kind = "openai" if rng.random() < plan.openai_share else "native"
        cancel = rng.uniform(0.2, 3.0) if rng.random() < plan.cancel_share else None
        spec = Spec(
            n=n,
            kind=kind,
            seed=rng.randrange(1 << 30),
            prompt=f"chaos {plan.seed} request {n}",
            max_tokens=rng.randint(*plan.max_tokens),
            cancel_after=cancel,
        )
        out.append((at, spec))


def run(plan: Plan, say: Callable[[str], None], keep_logs: Path) -> tuple[History, list[Violation]]:
    """Start the stack, run the campaign, check it; on a violation, the processes' logs
    and the history (JSON) are copied to ``keep_logs``."""
    with Cluster() as cluster:
        say("chaos: starting Redis (AOF, Sentinels), 2 APIs, 3 workers on netns hosts")
        worker = {**WORKER, "lease_self_expiry": plan.self_expiry}
        stack = start_stack(
            cluster,
            sentinel=True,
            api=API,
            worker=worker,
            aof=True,
            debug=True,
            down_after_ms=DOWN_AFTER_MS,
        )
        rig = Rig(stack, worker, API)
        history = asyncio.run(_drive(plan, rig, say))
        history.processes = [
            Process(
                name=p.name,
                pid=p.pid,
                exit_code=p.popen.poll(),
                by_nemesis=p.pid in rig.ended,
                log_tail="" if p.popen.poll() is None else p.output()[-1500:],
            )
            for p in cluster.processes
        ]
        specs_ = [r.spec for r in history.requests]
        specs_ += history.batch.specs if history.batch is not None else []
        refs = {spec.n: asyncio.run(reference(spec)) for spec in specs_}
        violations = check(history, lambda spec: refs[spec.n])
        if violations:
            keep_logs.mkdir(parents=True, exist_ok=True)
            for log in cluster.workdir.glob("*.log"):
                shutil.copy(log, keep_logs / log.name)
            (keep_logs / "history.json").write_text(to_json(history))
            say(f"chaos: logs and history kept in {keep_logs}")
    return history, violations


async def _drive(plan: Plan, rig: Rig, say: Callable[[str], None]) -> History:
    rig.started = time.monotonic()
    history = History(plan.seed, plan.duration, started_unix=time.time(), bound=plan.bound)
    history.flush_seconds = FLUSH_SECONDS
    clients = Clients([rig.stack.api_url(h) for h in API_HOSTS], rig.started)
    kinds = [k for k in KINDS if not plan.kinds or k.name in plan.kinds]
    if plan.batch_lines:
        lines = batch.batch_specs(plan.seed, plan.batch_lines, plan.max_tokens)
        history.batch = await batch.submit(clients.apis, lines)
    nemesis = Nemesis(rig, plan.seed, kinds=kinds)
    history.faults = nemesis.faults
    faults = asyncio.create_task(nemesis.run(until=plan.duration))
    tasks: list[asyncio.Task[None]] = []
    say(f"chaos: seed {plan.seed}, {plan.duration:g} s of faults and clients")
    for at, spec in specs(plan):
        await asyncio.sleep(max(0.0, at - rig.now()))
        if faults.done():
            break  # the nemesis failed: stop the clients and report it
        request = Request(spec, submitted_at=rig.now())
        history.requests.append(request)
        rng = random.Random(f"client:{plan.seed}:{spec.n}")
        tasks.append(asyncio.create_task(clients.run(request, rng)))
    try:
        await faults
    except Exception as exc:  # a fault that could not be healed: a finding, not a crash
        history.nemesis_error = f"{type(exc).__name__}: {exc}"
        say(f"chaos: the nemesis failed: {history.nemesis_error}")
    finally:
        await rig.heal_all()
    history.quiet_at = rig.now()
    say(f"chaos: {len(history.faults)} faults; healed at {history.quiet_at:.0f} s; settling")
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=plan.bound)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    for request in history.requests:
        if request.outcome is None:
            request.outcome, request.ended_at = "hung", rig.now()
    if history.batch is not None:
        left = history.quiet_at + plan.bound - rig.now()
        await batch.collect(clients.apis, history.batch, max(left, 1.0))
    await _settle(rig, history)
    return history


async def _settle(rig: Rig, history: History) -> None:
    """Records, queue and running set once everything ended (or the bound ran out),
    and the counters once every process flushed."""
    redis = _redis(rig.stack)
    try:
        deadline = history.quiet_at + history.bound
        while True:
            waiting = await _read_records(redis, history)
            queued = await redis.zcard(keys.queue(MODEL))
            running = await redis.zcard(keys.running(MODEL))
            history.queued, history.running = int(queued), int(running)
            if (not waiting and not queued and not running) or rig.now() > deadline:
                break
            await asyncio.sleep(0.5)
    finally:
        await redis.aclose(close_connection_pool=True)
    await asyncio.sleep(FLUSH_SECONDS * 2.5)  # every process's last counts flushed
    history.counters, history.lease_lost_tokens = await _counters(rig)


async def _read_records(redis: Redis, history: History) -> int:
    """Read every request's record; how many are not terminal yet."""
    waiting = 0
    for r in history.requests:
        if r.request_id is None or r.record.get("status") in TERMINAL:
            continue
        fields: dict[str, str] = await redis.hgetall(keys.request(r.request_id))  # type: ignore[misc]
        r.record = {str(k): str(v) for k, v in fields.items()}
        if r.record.get("status") not in TERMINAL:
            waiting += 1
            continue
        try:
            finished = float(r.record["finished_at"]) - history.started_unix
        except (KeyError, ValueError):
            finished = time.time() - history.started_unix  # seen terminal now
        r.settled_after = max(0.0, finished - history.quiet_at)
    return waiting


_SAMPLE = re.compile(r"^(llmq_requests_total|llmq_lease_lost_tokens_total)\{([^}]*)\} (\S+)$", re.M)
_REASON = re.compile(r'finished_reason="([^"]*)"')


async def _counters(rig: Rig) -> tuple[dict[str, float], float]:
    """``llmq_requests_total`` by finished_reason, and the lease-lost tokens, cluster-wide."""
    url = rig.stack.api_url(API_HOSTS[0]) + "/metrics"
    async with httpx.AsyncClient(timeout=10) as http:
        text = (await http.get(url)).text
    counters: dict[str, float] = {}
    lost = 0.0
    for name, labels, value in _SAMPLE.findall(text):
        if 'model="mock"' not in labels:
            continue
        if name == "llmq_lease_lost_tokens_total":
            lost += float(value)
            continue
        reason = _REASON.search(labels)
        if reason:
            counters[reason.group(1)] = counters.get(reason.group(1), 0.0) + float(value)
    return counters, lost
