"""A real local Redis Cluster for the tests: three primaries and a replica of each.

Six ``redis-server --cluster-enabled yes`` on free ports in a temporary directory,
joined by ``redis-cli --cluster create --cluster-replicas 1``; ready once every
node says ``cluster_state:ok``. llmq reaches it through a ``redis+cluster://`` URL
of one node (:mod:`llmq.connection`). Started once per test session (about two
seconds) and flushed between tests.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest
import redis

from llmq.embedded import EmbeddedRedis

NODES = 6


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


class LocalCluster:
    """Six nodes: ``primaries`` are the first three ports when created."""

    def __init__(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="llmq-cluster-")
        self.nodes: list[EmbeddedRedis] = []

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}/0"

    def start(self, timeout: float = 30) -> None:
        for i in range(NODES):
            node = EmbeddedRedis(
                cluster_port(),
                directory=f"{self.directory}/{i}",
                extra_args=(
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "1000",
                ),
            )
            os.makedirs(node.directory, exist_ok=True)
            node.start()
            self.nodes.append(node)
        cli = shutil.which("redis-cli")
        if cli is None:
            raise RuntimeError("redis-cli is not on PATH")
        addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
        subprocess.run(
            [cli, "--cluster", "create", *addresses, "--cluster-replicas", "1", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=timeout,
        )
        deadline = time.monotonic() + timeout
        while not self.ready():
            if time.monotonic() > deadline:
                raise RuntimeError("the Redis Cluster did not reach cluster_state:ok")
            time.sleep(0.05)

    def ready(self) -> bool:
        for node in self.nodes:
            client = redis.Redis(port=node.port, decode_responses=True)
            try:
                info = str(client.execute_command("CLUSTER", "INFO"))  # type: ignore[no-untyped-call]
            finally:
                client.close()
            if "cluster_state:ok" not in info:
                return False
        return True

    def flush(self) -> None:
        client = redis.RedisCluster(host="127.0.0.1", port=self.nodes[0].port)
        try:
            client.flushall(target_nodes=redis.RedisCluster.PRIMARIES)
        finally:
            client.close()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalCluster]:
    cluster = LocalCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
