"""The nemesis: faults injected at random times drawn from a seed.

Each fault kind is a small object with a ``name`` and ``run(rig, rng, fault)``
that injects the fault, holds it for a time drawn from ``rng``, and heals it
(restarts what it killed, resumes what it stopped, brings a cut link back up).
:class:`Nemesis` draws the next fault and the gap before it from its own
``random.Random(seed)``, one fault at a time (kinds that overlap faults on
purpose do so inside one run), so a seed names one schedule of faults; the
system's timing still varies from run to run.

The :class:`Rig` is what faults act on: the :class:`rigs.hosts.Stack`, the
settings it restarts processes with, and the pids the nemesis ended, so that the
checker can tell its kills from crashes.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import httpx
from redis.asyncio import Redis

from bench.chaos.history import Fault
from bench.scenarios.host_faults import _primary, _replica_ready
from rigs.hosts import API_HOSTS, WORKER_HOSTS, Stack
from rigs.netns import REDIS_PORT, HostProcess

#: The processes a fault can signal.
Role = Literal["worker", "api", "redis"]


@dataclass
class Rig:
    """The stack under test and how to restart its processes."""

    stack: Stack
    worker_settings: dict[str, Any]
    api_settings: dict[str, Any]
    started: float = field(default_factory=time.monotonic)
    #: Pids the nemesis killed or stopped for good (SIGKILL, SIGTERM).
    ended: set[int] = field(default_factory=set)
    #: Processes the nemesis SIGSTOPped and has not resumed yet.
    paused: dict[int, HostProcess] = field(default_factory=dict)
    cut: set[str] = field(default_factory=set)

    def now(self) -> float:
        return time.monotonic() - self.started

    def end(self, proc: HostProcess, sig: signal.Signals) -> None:
        self.ended.add(proc.pid)
        self.resume(proc)  # a stopped process would not act on SIGTERM
        proc.signal(sig)

    def pause(self, proc: HostProcess) -> None:
        self.paused[proc.pid] = proc
        proc.signal(signal.SIGSTOP)

    def resume(self, proc: HostProcess) -> None:
        if self.paused.pop(proc.pid, None) is not None:
            proc.signal(signal.SIGCONT)

    def partition(self, host: str) -> None:
        self.cut.add(host)
        self.stack.cluster.cut(host)

    def heal(self, host: str) -> None:
        self.cut.discard(host)
        self.stack.cluster.heal(host)

    async def target(self, role: Role, rng: random.Random) -> str:
        """The host of a fault on ``role``: a worker or API host drawn from ``rng``, or
        the Redis primary (nothing drawn)."""
        if role == "redis":
            return await self.primary()
        return rng.choice(WORKER_HOSTS if role == "worker" else API_HOSTS)

    def process(self, role: Role, host: str) -> HostProcess:
        return {"worker": self.stack.workers, "api": self.stack.apis, "redis": self.stack.redis}[
            role
        ][host]

    async def restart(self, role: Role, host: str) -> None:
        """Start ``host``'s ``role`` again once it has exited; a Redis counts as back
        once every replica has resynced: a primary lost before that (the next fault)
        would take with it everything since the restart."""
        if role == "worker":
            await self.restart_worker(host)
        elif role == "api":
            await self.restart_api(host)
        else:
            await self.restart_redis(host)
            await self.replicas_ready()

    async def restart_worker(self, host: str) -> None:
        await _exited(self.stack.workers[host])
        self.stack.start_worker(host, **self.worker_settings)

    async def worker_ids(self) -> set[str]:
        """The workers the registry lists (asked of any API that answers)."""
        async with httpx.AsyncClient(timeout=1.0) as http:
            for host in self.stack.apis:
                try:
                    got = await http.get(self.stack.api_url(host) + "/v1/workers")
                except httpx.HTTPError:
                    continue
                if got.status_code == 200:
                    return {str(w["id"]) for w in got.json()["data"]}
        return set()

    async def worker_ready(self, before: set[str], timeout: float = 60.0) -> None:
        """Until the registry lists a worker that is not in ``before`` (the restarted one)."""
        deadline = time.monotonic() + timeout
        while not (await self.worker_ids()) - before:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no restarted worker registered within {timeout:g} s")
            await asyncio.sleep(0.1)

    async def restart_api(self, host: str) -> None:
        await _exited(self.stack.apis[host])
        self.stack.start_api(host, **self.api_settings)
        await self.api_ready(host)

    async def api_ready(self, host: str, timeout: float = 60.0) -> None:
        url = self.stack.api_url(host) + "/readyz"
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=1.0) as http:
            while time.monotonic() < deadline:
                try:
                    if (await http.get(url)).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.1)
        raise TimeoutError(f"the API on {host} was not ready {timeout:g} s after its restart")

    async def primary(self) -> str:
        return await _primary(self.stack)

    async def restart_redis(self, host: str, replica_of: str | None = None) -> None:
        await _exited(self.stack.redis[host])
        self.stack.start_redis_on(host, replica_of=replica_of)
        await asyncio.to_thread(self.stack.cluster.wait_port, host, REDIS_PORT, 30.0)

    async def replicas_ready(self, timeout: float = 60.0) -> None:
        """Every Redis other than the primary replicates it, as the Sentinels see."""
        deadline = time.monotonic() + timeout
        primary = await self.primary()
        for host in self.stack.redis:
            while host != primary and not await _replica_ready(self.stack, host):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{host} did not resync with {primary} in {timeout:g} s")
                await asyncio.sleep(0.2)

    async def heal_all(self) -> None:
        """Every link up, every process resumed and running: the end of the faults
        (after a fault that failed half-way too)."""
        for host in list(self.cut):
            self.heal(host)
        for proc in list(self.paused.values()):
            self.resume(proc)
        for host, proc in list(self.stack.redis.items()):
            if not proc.running():
                primary = await _answered_primary(self)
                await self.restart_redis(host, None if primary in (host, None) else primary)
        for host, proc in self.stack.workers.items():
            if not proc.running():
                self.stack.start_worker(host, **self.worker_settings)
        for host, proc in self.stack.apis.items():
            if not proc.running():
                self.stack.start_api(host, **self.api_settings)
        for host in self.stack.apis:
            await self.api_ready(host)


async def _exited(proc: HostProcess, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while proc.running() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if proc.running():
        proc.kill()


class Kind(Protocol):
    """A fault kind: inject, hold, heal; notes what it did in ``fault``."""

    @property
    def name(self) -> str: ...

    async def run(self, rig: Rig, rng: random.Random, fault: Fault) -> None: ...


@dataclass(frozen=True)
class Kill:
    """End a process with ``sig`` and restart it after ``down`` seconds (drawn; none:
    at once, once it has exited). SIGKILL: its leases run out meanwhile, its OpenAI
    streams are cut; SIGTERM (a deploy): it drains, hands the rest back and exits."""

    name: str
    role: Role
    sig: signal.Signals = signal.SIGKILL
    down: tuple[float, float] | None = None

    async def run(self, rig: Rig, rng: random.Random, fault: Fault) -> None:
        host = await rig.target(self.role, rng)
        fault.targets = [host]
        if self.role == "api":  # which clients' streams it ended (the checker's graceful)
            fault.detail["apis"] = [rig.stack.api_url(host)]
        rig.end(rig.process(self.role, host), self.sig)
        if self.down is not None:
            await asyncio.sleep(rng.uniform(*self.down))
        await rig.restart(self.role, host)


@dataclass(frozen=True)
class RollingRestart:
    """A deploy: every API process, then every worker, one at a time, is sent SIGTERM,
    started again once it has exited, and waited for (ready, registered) before the
    next. Nothing may fail for it (the checker's ``graceful``)."""

    name: str = "rolling-restart"

    async def run(self, rig: Rig, rng: random.Random, fault: Fault) -> None:
        fault.targets = [*API_HOSTS, *WORKER_HOSTS]
        fault.detail["apis"] = [rig.stack.api_url(host) for host in API_HOSTS]
        for host in API_HOSTS:
            rig.end(rig.stack.apis[host], signal.SIGTERM)
            await rig.restart_api(host)
        for host in WORKER_HOSTS:
            before = await rig.worker_ids()
            rig.end(rig.stack.workers[host], signal.SIGTERM)
            await rig.restart_worker(host)
            await rig.worker_ready(before)


@dataclass(frozen=True)
class Pause:
    """SIGSTOP a process for seconds (a worker stops renewing, then wakes up fenced; the
    Redis primary for less than the Sentinels' down-after), then SIGCONT."""

    name: str
    role: Role
    seconds: tuple[float, float]

    async def run(self, rig: Rig, rng: random.Random, fault: Fault) -> None:
        host = await rig.target(self.role, rng)
        fault.targets = [host]
        proc = rig.process(self.role, host)
        rig.pause(proc)
        await asyncio.sleep(rng.uniform(*self.seconds))
        rig.resume(proc)


@dataclass(frozen=True)
class AllWorkersKill:
    """SIGKILL every worker at once; restart them all after a while."""

    name: str = "all-workers-kill"

    async def run(self, rig: Rig, rng: random.Random, fault: Fault) -> None:
        fault.targets = list(WORKER_HOSTS)
        for host in WORKER_HOSTS:
            rig.end(rig.stack.workers[host], signal.SIGKILL)
        await asyncio.sleep(rng.uniform(0.5, 3.0))
        for host in WORKER_HOSTS:
            await rig.restart_worker(host)


@dataclass(frozen=True)
class RedisSleep:
    """``DEBUG SLEEP`` on the Redis primary: slow, not down."""

    name: str = "redis-sleep"

    async def run(self, rig: Rig, rng: random.Random, fault: Fault) -> None:
        host = await rig.primary()
        seconds = round(rng.uniform(0.5, 3.0), 2)
        fault.targets, fault.detail["seconds"] = [host], seconds
        cluster = rig.stack.cluster
        redis = Redis(
            host=cluster.hosts[host].address,
            port=REDIS_PORT,
            password=cluster.password,
            socket_timeout=seconds + 10,
        )
        try:
            await redis.execute_command("DEBUG", "SLEEP", seconds)  # type: ignore[no-untyped-call]
        finally:
            await redis.aclose()


@dataclass(frozen=True)
class RedisStallWorkerKill:
    """Overlapping faults: the Redis primary stalls (SIGSTOP) while a worker dies."""

    name: str = "redis-stall-worker-kill"

    async def run(self, rig: Rig, rng: random.Random, fault: Fault) -> None:
        host = await rig.primary()
        worker = rng.choice(WORKER_HOSTS)
        fault.targets = [host, worker]
        proc = rig.stack.redis[host]
        rig.pause(proc)
        await asyncio.sleep(rng.uniform(0.2, 1.0))
        rig.end(rig.stack.workers[worker], signal.SIGKILL)
        await asyncio.sleep(rng.uniform(0.5, 2.0))
        rig.resume(proc)
        await asyncio.sleep(rng.uniform(0.0, 1.0))
        await rig.restart_worker(worker)


@dataclass(frozen=True)
class Partition:
    """Cut a worker or API host's link for seconds (its processes run on), then heal."""

    name: str
    hosts: Sequence[str]

    async def run(self, rig: Rig, rng: random.Random, fault: Fault) -> None:
        host = rng.choice(list(self.hosts))
        fault.targets = [host]
        rig.partition(host)
        await asyncio.sleep(rng.uniform(2.0, 6.0))
        rig.heal(host)


@dataclass(frozen=True)
class Failover:
    """The primary dies for good: the Sentinels promote its replica (after their
    down-after), and the old primary comes back as the new one's replica.

    Not ``SENTINEL FAILOVER`` with the old primary up: Sentinel demotes it only at
    its next check (up to 10 s later), and until then processes whose connections
    still point at it write to it, and those writes vanish when it resyncs
    (docs/chaos.md)."""

    name: str = "sentinel-failover"

    async def run(self, rig: Rig, rng: random.Random, fault: Fault) -> None:
        old = await rig.primary()
        rig.end(rig.stack.redis[old], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while (new := await _answered_primary(rig)) in (old, None):
            if time.monotonic() > deadline:
                raise TimeoutError("the Sentinels did not promote a replica within 60 s")
            await asyncio.sleep(0.2)
        fault.targets, fault.detail["promoted"] = [old], new
        await rig.restart_redis(old, replica_of=new)
        while not await _replica_ready(rig.stack, old):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{old} did not become a replica of {new} within 60 s")
            await asyncio.sleep(0.2)


async def _answered_primary(rig: Rig) -> str | None:
    try:
        return await rig.primary()
    except RuntimeError:  # no Sentinel answered this time
        return None


#: Every fault kind the nemesis draws from.
KINDS: tuple[Kind, ...] = (
    Kill("worker-kill", "worker", down=(0.5, 3.0)),
    Pause("worker-pause", "worker", seconds=(1.0, 4.0)),
    Kill("worker-term", "worker", signal.SIGTERM),
    AllWorkersKill(),
    Kill("api-kill", "api", down=(0.5, 2.0)),
    Kill("api-term", "api", signal.SIGTERM),
    Pause("api-pause", "api", seconds=(1.0, 3.0)),
    RollingRestart(),
    Kill("redis-kill", "redis", down=(0.2, 1.5)),
    Pause("redis-pause", "redis", seconds=(0.5, 3.0)),
    RedisSleep(),
    RedisStallWorkerKill(),
    Partition("worker-partition", WORKER_HOSTS),
    Partition("api-partition", API_HOSTS),
    Failover(),
)


@dataclass
class Nemesis:
    """Faults one after another, with gaps of ``gap`` seconds (uniform), from ``seed``."""

    rig: Rig
    seed: int
    kinds: Sequence[Kind] = KINDS
    gap: tuple[float, float] = (1.0, 4.0)
    faults: list[Fault] = field(default_factory=list)

    async def run(self, until: float) -> None:
        """Inject faults until ``until`` (campaign seconds); the last one is healed."""
        rng = random.Random(f"nemesis:{self.seed}")
        while True:
            await asyncio.sleep(rng.uniform(*self.gap))
            if self.rig.now() >= until:
                return
            kind = rng.choice(list(self.kinds))
            fault = Fault(kind.name, [], self.rig.now())
            self.faults.append(fault)
            try:
                await kind.run(self.rig, rng, fault)
            finally:
                fault.ended_at = self.rig.now()
