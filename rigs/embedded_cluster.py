"""A private Redis Cluster on free ports, for the tests and the benchmark.

``primaries`` ``redis-server --cluster-enabled yes`` nodes (and ``replicas`` of
each) in a temporary directory, joined by ``redis-cli --cluster create``; ready
once every node says ``cluster_state:ok``. llmq reaches it through the
``redis+cluster://`` URL of one node (:mod:`llmq.connection`).
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from typing import Any, cast

import redis

from llmq.embedded import EmbeddedRedis, EmbeddedRedisError


def cluster_port() -> int:
    """A free port below 55536 whose cluster bus port (10000 above) is free too."""
    while True:
        port = random.randint(20_000, 45_000)
        try:
            for p in (port, port + 10_000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port


class EmbeddedCluster:
    """``primaries * (1 + replicas)`` nodes; a context manager."""

    def __init__(self, primaries: int = 3, replicas: int = 1) -> None:
        self.primaries = primaries
        self.replicas = replicas
        self.directory = tempfile.mkdtemp(prefix="llmq-cluster-")
        self.nodes: list[EmbeddedRedis] = []

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}/0"

    def pids(self) -> list[int]:
        return [n.process.pid for n in self.nodes if n.process is not None]

    def start(self, timeout: float = 30) -> None:
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout: float) -> None:
        for i in range(self.primaries * (1 + self.replicas)):
            node = EmbeddedRedis(
                cluster_port(),
                directory=os.path.join(self.directory, str(i)),
                extra_args=(
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "1000",
                    # a replica syncs at once, not after the default 5 s wait for others
                    "--repl-diskless-sync-delay",
                    "0",
                ),
            )
            os.makedirs(node.directory, exist_ok=True)
            node.start()
            self.nodes.append(node)
        if self.primaries < 3:  # below redis-cli's minimum: slots assigned by hand
            self._assign_slots()
        else:
            self._create(timeout)
        deadline = time.monotonic() + timeout
        while not self.ready():
            if time.monotonic() > deadline:
                raise EmbeddedRedisError("the Redis Cluster did not reach cluster_state:ok")
            time.sleep(0.05)

    def _create(self, timeout: float) -> None:
        cli = shutil.which("redis-cli")
        if cli is None:
            raise EmbeddedRedisError("redis-cli is not on PATH")
        addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
        replicas = ["--cluster-replicas", str(self.replicas), "--cluster-yes"]
        subprocess.run(
            [cli, "--cluster", "create", *addresses, *replicas],
            check=True,
            capture_output=True,
            timeout=timeout,
        )

    def _assign_slots(self) -> None:
        """Split the 16384 slots over the primaries and have them meet (no replicas)."""
        if self.replicas:
            raise EmbeddedRedisError("replicas need at least three primaries")
        share = 16384 // self.primaries
        for i, node in enumerate(self.nodes):
            last = 16383 if i == len(self.nodes) - 1 else (i + 1) * share - 1
            client = redis.Redis(port=node.port)
            try:
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", i * share, last)  # type: ignore[no-untyped-call]
                for other in self.nodes[:i]:
                    client.execute_command("CLUSTER", "MEET", "127.0.0.1", other.port)  # type: ignore[no-untyped-call]
            finally:
                client.close()

    def ready(self) -> bool:
        """Every node says ``cluster_state:ok``, and every replica is in sync (one that
        never synced cannot take over from its primary)."""
        for node in self.nodes:
            client = redis.Redis(port=node.port, decode_responses=True)
            try:
                info = str(client.execute_command("CLUSTER", "INFO"))  # type: ignore[no-untyped-call]
                replication = cast(dict[str, Any], client.info("replication"))
            finally:
                client.close()
            if "cluster_state:ok" not in info:
                return False
            if replication.get("role") == "slave" and replication.get("master_link_status") != "up":
                return False
        return True

    def owner_of(self, key: str) -> EmbeddedRedis:
        """The node serving ``key``'s slot now."""
        client = redis.RedisCluster(host="127.0.0.1", port=self.nodes[0].port)
        try:
            port = client.get_node_from_key(key).port
        finally:
            client.close()
        return next(n for n in self.nodes if n.port == port)

    def flush(self) -> None:
        """Empty every primary."""
        client = redis.RedisCluster(host="127.0.0.1", port=self.nodes[0].port)
        try:
            client.flushall(target_nodes=redis.RedisCluster.PRIMARIES)
        finally:
            client.close()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> EmbeddedCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
