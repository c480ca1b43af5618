"""The namespace cluster itself: hosts reach each other, a cut partitions, teardown is total."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rigs.netns import Cluster, remove_stale
from tests.support.hosts import require_netns
from tests.support.processes import alive, wait_for

pytestmark = [pytest.mark.timeout(60), pytest.mark.netns]


def leftovers(tag: str) -> str:
    """Namespaces and links whose name contains ``tag``."""
    found = subprocess.run(
        "ip netns list; ip -o link show", shell=True, capture_output=True, text=True, check=True
    ).stdout
    return "\n".join(line for line in found.splitlines() if tag in line)


def reachable(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


def test_a_cut_partitions_a_host_and_close_leaves_nothing() -> None:
    require_netns()
    cluster = Cluster(names=("a", "b"))
    with cluster:
        server = cluster.run(
            "a", [sys.executable, "-m", "http.server", "8080", "--bind", "0.0.0.0"]
        )
        address = cluster.hosts["a"].address
        wait_for(lambda: reachable(address, 8080), 10, "the server on host a")
        probe = [
            sys.executable,
            "-c",
            f"import socket; socket.create_connection(('{address}', 8080), timeout=1)",
        ]
        assert cluster.run("b", probe).popen.wait(10) == 0
        cluster.cut("a")
        assert not reachable(address, 8080)
        assert cluster.run("b", probe).popen.wait(10) != 0
        cluster.heal("a")
        wait_for(lambda: reachable(address, 8080), 10, "host a after the heal")
        tag = cluster.bridge[3:]
    assert not alive(server.pid)
    assert leftovers(tag) == ""
    assert leftovers(f"llmq-{os.getpid()}-") == ""


def test_what_a_killed_creator_left_behind_is_removed() -> None:
    require_netns()
    code = (
        "import sys, time; from rigs.netns import Cluster; c = Cluster(names=('x',)).create(); "
        "c.run('x', ['sleep', '300']); print(c.bridge, c.workdir, flush=True); time.sleep(300)"
    )
    creator = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert creator.stdout is not None
    bridge, workdir = creator.stdout.readline().split()
    creator.send_signal(signal.SIGKILL)
    creator.wait(10)
    creator.stdout.close()
    assert leftovers(bridge[3:])  # SIGKILL: no chance to clean up
    deadline = time.monotonic() + 10
    remove_stale()
    while leftovers(bridge[3:]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert leftovers(bridge[3:]) == ""
    assert not Path(workdir).exists()
