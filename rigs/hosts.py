"""llmq on a cluster of network-namespace hosts: Redis (with Sentinels), APIs, workers.

The processes and settings are the ones a deployment on real machines uses; only
the addresses are namespace addresses. ``python -m rigs.hosts`` (``make cluster``)
starts the standard layout for a person to try and stops it on Ctrl-C.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from redis import Redis as SyncRedis

from rigs.netns import (
    API_PORT,
    REDIS_PORT,
    SENTINEL_MASTER,
    SENTINEL_PORT,
    Cluster,
    HostProcess,
)

REDIS_HOSTS = ("redis1", "redis2", "redis3")
API_HOSTS = ("api1", "api2")
WORKER_HOSTS = ("worker1", "worker2", "worker3")


def _env(settings: dict[str, Any]) -> dict[str, str]:
    return {f"LLMQ_{k.upper()}": str(v) for k, v in settings.items()}


@dataclass
class Stack:
    """The llmq processes of one cluster, by host."""

    cluster: Cluster
    sentinel: bool
    #: Redis with its append-only file and ``DEBUG``; Sentinels' down-after (ms).
    aof: bool = False
    debug: bool = False
    down_after_ms: int = 1000
    redis: dict[str, HostProcess] = field(default_factory=dict)
    sentinels: dict[str, HostProcess] = field(default_factory=dict)
    apis: dict[str, HostProcess] = field(default_factory=dict)
    workers: dict[str, HostProcess] = field(default_factory=dict)

    def redis_env(self) -> dict[str, str]:
        """How every llmq process finds Redis: the primary's URL, or the Sentinels."""
        env = {"LLMQ_REDIS_URL": self.cluster.redis_url("redis1")}
        if self.sentinel:
            env["LLMQ_REDIS_SENTINELS"] = self.cluster.sentinels(REDIS_HOSTS)
        return env

    def api_url(self, host: str) -> str:
        return f"http://{self.cluster.hosts[host].address}:{API_PORT}"

    def start_redis_on(self, host: str, replica_of: str | None = None) -> HostProcess:
        """(Re)start the Redis of ``host`` with the stack's options."""
        proc = self.cluster.start_redis(host, replica_of=replica_of, aof=self.aof, debug=self.debug)
        self.redis[host] = proc
        return proc

    def start_redis(self) -> None:
        self.start_redis_on("redis1")
        if self.sentinel:
            self.start_redis_on("redis2", replica_of="redis1")
            for host in REDIS_HOSTS:
                self.sentinels[host] = self.cluster.start_sentinel(
                    host, primary="redis1", down_after_ms=self.down_after_ms
                )
        for host in self.redis:
            self.cluster.wait_port(host, REDIS_PORT)
        for host in self.sentinels:
            self.cluster.wait_port(host, SENTINEL_PORT)

    def start_api(self, host: str, **settings: Any) -> HostProcess:
        chosen = {"host": self.cluster.hosts[host].address, "port": API_PORT, **settings}
        proc = self.cluster.llmq(host, "api", {**self.redis_env(), **_env(chosen)})
        self.apis[host] = proc
        return proc

    def start_worker(self, host: str, **settings: Any) -> HostProcess:
        proc = self.cluster.llmq(host, "worker", {**self.redis_env(), **_env(settings)})
        self.workers[host] = proc
        return proc

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Every API answers /readyz and lists every worker."""
        deadline = time.monotonic() + timeout
        for host, proc in self.apis.items():
            while True:
                if not proc.running():
                    raise RuntimeError(f"API on {host} exited:\n{proc.output()[-3000:]}")
                try:
                    r = httpx.get(self.api_url(host) + "/v1/workers", timeout=1)
                    if r.status_code == 200 and len(r.json()["data"]) >= len(self.workers):
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    logs = "\n".join(p.output()[-1500:] for p in self.cluster.processes)
                    raise RuntimeError(f"the stack on {host} did not get ready:\n{logs}")
                time.sleep(0.1)
        while self.sentinels and not self._sentinels_know_a_replica():
            if time.monotonic() > deadline:
                raise RuntimeError("the Sentinels do not list a healthy replica")
            time.sleep(0.1)

    def _sentinels_know_a_replica(self) -> bool:
        """Every Sentinel lists a replica that is up: until then a killed primary has
        no successor (the Sentinels abort with ``-failover-abort-no-good-slave`` and
        retry only after twice their ``failover-timeout``)."""
        for host in self.sentinels:
            sentinel = SyncRedis(
                host=self.cluster.hosts[host].address, port=SENTINEL_PORT, socket_timeout=1
            )
            try:
                replicas = sentinel.sentinel_slaves(SENTINEL_MASTER)  # type: ignore[no-untyped-call]
            except Exception:
                return False
            finally:
                sentinel.close()
            if not any(not r["is_sdown"] and r.get("master-link-status") == "ok" for r in replicas):
                return False
        return True

    def worker_host(self, worker_id: str) -> str | None:
        """The host of the worker whose id (``host-pid-hex``) this is."""
        for host, proc in self.workers.items():
            if f"-{proc.pid}-" in worker_id:
                return host
        return None


def start_stack(
    cluster: Cluster,
    *,
    sentinel: bool = False,
    api: dict[str, Any] | None = None,
    worker: dict[str, Any] | None = None,
    api_hosts: Sequence[str] = API_HOSTS,
    worker_hosts: Sequence[str] = WORKER_HOSTS,
    **redis: Any,
) -> Stack:
    """Redis (primary, plus replica and three Sentinels with ``sentinel``), APIs, workers;
    ``redis``: the :class:`Stack`'s Redis options (``aof``, ``debug``, ``down_after_ms``)."""
    stack = Stack(cluster, sentinel, **redis)
    stack.start_redis()
    for host in worker_hosts:
        stack.start_worker(host, **(worker or {}))
    for host in api_hosts:
        stack.start_api(host, **(api or {}))
    stack.wait_ready()
    return stack


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rigs.hosts",
        description="Start llmq on network-namespace hosts (root); Ctrl-C stops it.",
    )
    parser.add_argument("--no-sentinel", action="store_true", help="one Redis, no failover")
    args = parser.parse_args(argv)
    with Cluster() as cluster:
        stack = start_stack(cluster, sentinel=not args.no_sentinel)
        print(f"cluster 198.18.{cluster.subnet}.0/24 (this namespace: {cluster.control_address})")
        for name, host in cluster.hosts.items():
            print(f"  {name:8} {host.address:16} netns {host.ns}")
        for name in stack.apis:
            print(f"API {name}: {stack.api_url(name)}")
        client = cluster.hosts["client"].ns
        print(
            f"try: ip netns exec {client} curl -N {stack.api_url('api1')}/v1/completions "
            "-H 'content-type: application/json' "
            '-d \'{"model": "mock", "prompt": "hi", "max_tokens": 20, "stream": true}\''
        )
        print(f"cut a host: ip link set {cluster.hosts['worker1'].link} down (heal: up)")
        print(f"logs: {cluster.workdir}; Ctrl-C stops everything")
        sys.stdout.flush()
        stop = False

        def _stop(*_: object) -> None:
            nonlocal stop
            stop = True

        signal.signal(signal.SIGTERM, _stop)
        reported: set[str] = set()
        try:
            while not stop:
                for proc in cluster.processes:
                    if not proc.running() and proc.name not in reported:
                        reported.add(proc.name)
                        print(f"exited: {proc.name} (log {proc.log})", flush=True)
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
        print("stopping")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
