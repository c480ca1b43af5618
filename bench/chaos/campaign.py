"""One campaign: the stack on network-namespace hosts, clients and the nemesis for
``duration`` seconds, then the faults healed, the system left to settle, and the
whole history checked.

The stack: Redis with its append-only file (primary, replica, three Sentinels),
two API hosts, three worker hosts and the client side in the root namespace
(which reaches every host over the bridge). Clients of three tenants with quotas
(:mod:`bench.chaos.tenants`: one flooding, one bursty, one steady) arrive as drawn
from the seed: half native, half OpenAI streams, a share cancelling at a random
moment, each asking ``max_tokens`` with ``ignore_eos`` so that the expected text is
exactly that many tokens of the mock for its seed (:func:`reference`); and batches
of such lines through the Batch API (:mod:`bench.chaos.batch`), one after another
throughout.
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

from bench.chaos import batch, tenants
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
API: dict[str, Any] = {"sse_keepalive_seconds": 1.0, "tenant_header": "X-Tenant"}
#: What the ``wait`` bound allows beyond a worker's loss: a claim, a prefill and a
#: token interval, and the clients' and APIs' scheduling on a loaded 2-CPU host.
WAIT_MARGIN = 2.0


def wait_bound(worker: dict[str, Any], max_tokens: int) -> float:
    """The longest a request of a tenant below its share may wait for its first token
    (docs/chaos.md): what losing its worker costs (the lease running out, or the drain
    of a SIGTERMed worker, then the sweep that requeues it), plus a slot freeing in a
    pool full of other tenants' requests (an interactive run is not preempted, a batch
    line is: at worst the longest run, ``max_tokens`` at the mock's speed), plus
    :data:`WAIT_MARGIN`."""
    settings = WorkerSettings(**worker)
    lost = max(settings.lease_seconds, settings.drain_seconds)
    longest_run = max_tokens / settings.model_tokens_per_second
    return lost + settings.sweep_seconds + longest_run + WAIT_MARGIN


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
    #: Lines of each batch run beside the clients, one after another (0: none).
    batch_lines: int = 20
    #: The flooding tenant's arrivals (far above its share: its quota refuses most).
    flood_per_second: float = 3.0
    #: The bursty tenant's bursts: this many requests at once, every so many seconds.
    burst: int = 4
    burst_every: tuple[float, float] = (4.0, 6.0)


def replay_command(plan: Plan) -> str:
    return f"python -m bench --scenarios chaos --seed {plan.seed} --duration {plan.duration:g}"


async def reference(spec: Spec, worker: dict[str, Any] = WORKER) -> list[str]:
    """The tokens of an undisturbed run: the mock for the seed, without its waits, with
    the chance to stop of workers run with ``worker`` settings (its draws shape the
    tokens even under ``ignore_eos``)."""
    stop = WorkerSettings(**worker).mock_stop_probability()
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
    """Every request of the campaign, with its arrival time (seconds), from the seed:
    the steady tenant's, the flooding one's, the bursty one's, numbered by arrival."""
    arrivals = _poisson(plan, f"clients:{plan.seed}", plan.arrivals_per_second, tenants.STEADY)
    arrivals += _poisson(plan, f"flood:{plan.seed}", plan.flood_per_second, tenants.FLOOD)
    rng, at = random.Random(f"bursty:{plan.seed}"), 0.0
    while (at := at + rng.uniform(*plan.burst_every)) < plan.duration:
        arrivals += [(at, tenants.BURSTY, rng) for _ in range(plan.burst)]
    arrivals.sort(key=lambda a: a[0])
    out = list[tuple[float, Spec]]()
    for n, (at, tenant, draw) in enumerate(arrivals):
        kind: Kind = "openai" if draw.random() < plan.openai_share else "native"
        cancel = draw.uniform(0.2, 3.0) if draw.random() < plan.cancel_share else None
        spec = Spec(
            n=n,
            kind=kind,
            seed=draw.randrange(1 << 30),
            prompt=f"chaos {plan.seed} request {n}",
            max_tokens=draw.randint(*plan.max_tokens),
            cancel_after=cancel,
            tenant=tenant,
        )
        out.append((at, spec))
    return out


def _poisson(
    plan: Plan, name: str, per_second: float, tenant: str
) -> list[tuple[float, str, random.Random]]:
    """Arrivals of one tenant, each with the generator its request is drawn from."""
    rng, at = random.Random(name), 0.0
    out: list[tuple[float, str, random.Random]] = []
    while per_second > 0 and (at := at + rng.expovariate(per_second)) < plan.duration:
        out.append((at, tenant, random.Random(f"{name}:{len(out)}")))
    return out


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
        specs_ += [spec for run in history.batches for spec in run.specs]
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
    history.below_share = list(tenants.BELOW_SHARE)
    history.wait_bound = wait_bound(rig.worker_settings, plan.max_tokens[1])
    history.fault_tail = rig.worker_settings["lease_seconds"] + 1.0
    clients = Clients([rig.stack.api_url(h) for h in API_HOSTS], rig.started)
    kinds = [k for k in KINDS if not plan.kinds or k.name in plan.kinds]
    redis = _redis(rig.stack)
    try:
        await tenants.create(redis)
    finally:
        await redis.aclose(close_connection_pool=True)
    batches, quiet = None, asyncio.Event()
    if plan.batch_lines:
        batches = asyncio.create_task(
            batch.throughout(
                clients.apis,
                plan.seed,
                plan.batch_lines,
                plan.max_tokens,
                rig.now,
                quiet,
                plan.bound,
                history.batches,
            )
        )
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
    quiet.set()
    say(f"chaos: {len(history.faults)} faults; healed at {history.quiet_at:.0f} s; settling")
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=plan.bound)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    for request in history.requests:
        if request.outcome is None:
            request.outcome, request.ended_at = "hung", rig.now()
    if batches is not None:
        await batches
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
    names = [tenants.DEFAULT, *(t.name for t in tenants.TENANTS)]
    redis = _redis(rig.stack)
    try:
        history.quotas = await tenants.quotas(redis, names)
        history.tenant_tokens = await tenants.tokens(redis, names)
        for run in history.batches:
            await batch.read_finished(redis, run, history.started_unix)
    finally:
        await redis.aclose(close_connection_pool=True)


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
