"""A cluster of "hosts" on one machine: Linux network namespaces on a bridge.

Each host is a network namespace with its own address in 198.18.<n>.0/24 (the
benchmarking range), joined to a bridge in the root namespace by one veth pair.
Real ``redis-server``, ``llmq api`` and ``llmq worker`` processes run inside the
hosts, so they talk over real TCP between distinct addresses, and a host's link
can be cut (its root-side veth set down: a clean partition, its processes left
running) and healed. The root namespace holds the bridge's address (``.1``), the
"control" address from which tests and ``make cluster`` watch the cluster.

Names (namespaces, bridge, links) carry the creating process's pid and a random
tag, and each cluster takes a /24 that no other cluster on the machine uses, so
clusters of concurrent test runs never meet. ``close`` (also on interpreter exit)
kills every process by its process group and removes namespaces and links; a new
cluster first removes what a dead process left behind. Needs root.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from llmq.embedded import find_redis_server

#: Hosts of the standard layout, in address order.
LAYOUT = (
    "redis1",
    "redis2",
    "redis3",
    "api1",
    "api2",
    "worker1",
    "worker2",
    "worker3",
    "client",
)
REDIS_PORT = 6379
SENTINEL_PORT = 26379
API_PORT = 8000
SENTINEL_MASTER = "llmq"
_PREFIX = "llmq-"
_BRIDGE = "lqb"
_LOCK = Path(tempfile.gettempdir()) / "llmq-netns.lock"


class NetnsError(RuntimeError):
    """A namespace, link or process of the cluster could not be set up."""


def _ip(*args: str, check: bool = True) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_netns_pids(ns: str) -> None:
    for pid in _ip("netns", "pids", ns, check=False).split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def remove_stale() -> None:
    """Remove namespaces, bridges and log folders of clusters whose creator is gone."""
    for folder in Path(tempfile.gettempdir()).glob(f"{_PREFIX}netns-*-*"):
        match = re.match(rf"{_PREFIX}netns-(\d+)-", folder.name)
        if match and not _alive(int(match.group(1))):
            shutil.rmtree(folder, ignore_errors=True)
    for line in _ip("netns", "list", check=False).splitlines():
        name = line.split()[0] if line.strip() else ""
        match = re.match(rf"{_PREFIX}(\d+)-", name)
        if match and not _alive(int(match.group(1))):
            _kill_netns_pids(name)
            _ip("netns", "del", name, check=False)
    for line in _ip("-o", "link", "show", "type", "bridge", check=False).splitlines():
        match = re.match(rf"\d+: ({_BRIDGE}([0-9a-f]{{6}})[0-9a-f])[:@]", line)
        if match and not _alive(int(match.group(2), 16)):
            _ip("link", "del", match.group(1), check=False)


@contextlib.contextmanager
def _machine_lock() -> Iterator[None]:
    with _LOCK.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _free_subnet() -> int:
    used = set(re.findall(r"inet 198\.18\.(\d+)\.", _ip("-o", "-4", "addr", "show")))
    for n in range(1, 255):
        if str(n) not in used:
            return n
    raise NetnsError("every 198.18.<n>.0/24 is in use")


@dataclass
class Host:
    """One namespace: its logical name, namespace name, address and root-side link."""

    name: str
    ns: str
    address: str
    link: str


@dataclass
class HostProcess:
    """A process started inside a host, in its own process group, logging to a file."""

    host: Host
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def running(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        if self.running():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, sig)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL it if it outlives ``timeout``."""
        self.signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        self.kill()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5)


@dataclass
class Cluster:
    """Hosts on a bridge, and the processes started in them; a context manager."""

    names: Sequence[str] = LAYOUT
    password: str = field(default_factory=lambda: secrets.token_hex(12))
    hosts: dict[str, Host] = field(default_factory=dict, init=False)
    processes: list[HostProcess] = field(default_factory=list, init=False)
    subnet: int = field(default=0, init=False)
    bridge: str = field(default="", init=False)
    workdir: Path = field(
        default_factory=lambda: Path(tempfile.mkdtemp(prefix=f"{_PREFIX}netns-{os.getpid()}-"))
    )
    _closed: bool = field(default=False, init=False)

    # -- network ---------------------------------------------------------------------

    def create(self) -> Cluster:
        tag = f"{os.getpid():06x}{secrets.token_hex(1)[0]}"
        ns_prefix = f"{_PREFIX}{os.getpid()}-{tag[-1]}-"
        self.bridge = f"{_BRIDGE}{tag}"
        atexit.register(self.close)
        with _machine_lock():
            remove_stale()
            self.subnet = _free_subnet()
            _ip("link", "add", self.bridge, "type", "bridge", "forward_delay", "0")
            _ip("addr", "add", f"{self.control_address}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, name in enumerate(self.names):
            host = Host(name, ns_prefix + name, f"198.18.{self.subnet}.{10 + i}", f"lq{tag}{i:x}")
            self.hosts[name] = host
            inner = f"lp{tag}{i:x}"
            _ip("netns", "add", host.ns)
            _ip("link", "add", host.link, "type", "veth", "peer", "name", inner, "netns", host.ns)
            _ip("link", "set", host.link, "master", self.bridge, "up")
            _ip("-n", host.ns, "link", "set", "lo", "up")
            _ip("-n", host.ns, "addr", "add", f"{host.address}/24", "dev", inner)
            _ip("-n", host.ns, "link", "set", inner, "up")
        return self

    @property
    def control_address(self) -> str:
        """The root namespace's address on the bridge (tests and operators watch from it)."""
        return f"198.18.{self.subnet}.1"

    def cut(self, name: str) -> None:
        """Partition a host: its link goes down, its processes keep running."""
        _ip("link", "set", self.hosts[name].link, "down")

    def heal(self, name: str) -> None:
        _ip("link", "set", self.hosts[name].link, "up")

    # -- processes -------------------------------------------------------------------

    def run(
        self, host: str, argv: Sequence[str], *, env: dict[str, str] | None = None, name: str = ""
    ) -> HostProcess:
        """Start ``argv`` inside ``host`` in a new process group."""
        target = self.hosts[host]
        label = name or f"{host}-{Path(argv[0]).name}"
        log = self.workdir / f"{label}-{len(self.processes)}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                ["ip", "netns", "exec", target.ns, *argv],
                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        proc = HostProcess(target, label, popen, log)
        self.processes.append(proc)
        return proc

    def llmq(self, host: str, command: str, env: dict[str, str]) -> HostProcess:
        """``python -m llmq <command>`` inside ``host`` (this interpreter, so the same venv)."""
        clean = {k: v for k, v in os.environ.items() if not k.startswith("LLMQ_")}
        return self.run(host, [sys.executable, "-m", "cli", command], env={**clean, **env})

    def redis_url(self, host: str = "redis1") -> str:
        return f"redis://:{self.password}@{self.hosts[host].address}:{REDIS_PORT}/0"

    def start_redis(
        self, host: str, *, replica_of: str | None = None, aof: bool = False, debug: bool = False
    ) -> HostProcess:
        """A password-protected ``redis-server`` bound to the host's address and loopback;
        ``aof``: with its append-only file (a restart keeps what was acknowledged);
        ``debug``: accepting ``DEBUG`` (``DEBUG SLEEP`` stalls it) from any client."""
        directory = self.workdir / f"redis-{host}"
        directory.mkdir(exist_ok=True)
        argv = [
            find_redis_server(),
            "--port",
            str(REDIS_PORT),
            "--bind",
            f"{self.hosts[host].address} 127.0.0.1",
            "--requirepass",
            self.password,
            "--masterauth",
            self.password,
            "--dir",
            str(directory),
            "--save",
            "",
            "--appendonly",
            "yes" if aof else "no",
        ]
        if debug:
            argv += ["--enable-debug-command", "yes"]
        if replica_of is not None:
            argv += ["--replicaof", self.hosts[replica_of].address, str(REDIS_PORT)]
        return self.run(host, argv, name=f"{host}-redis")

    def start_sentinel(self, host: str, *, primary: str, down_after_ms: int = 1000) -> HostProcess:
        """A Sentinel (``redis-server --sentinel``) watching ``primary``, quorum 2."""
        conf = self.workdir / f"sentinel-{host}.conf"
        conf.write_text(
            f"port {SENTINEL_PORT}\n"
            f"bind {self.hosts[host].address} 127.0.0.1\n"
            f"dir {self.workdir}\n"
            f"sentinel monitor {SENTINEL_MASTER} {self.hosts[primary].address} {REDIS_PORT} 2\n"
            f"sentinel auth-pass {SENTINEL_MASTER} {self.password}\n"
            f"sentinel down-after-milliseconds {SENTINEL_MASTER} {down_after_ms}\n"
            f"sentinel failover-timeout {SENTINEL_MASTER} 10000\n"
            f"sentinel parallel-syncs {SENTINEL_MASTER} 1\n"
        )
        return self.run(
            host, [find_redis_server(), str(conf), "--sentinel"], name=f"{host}-sentinel"
        )

    def sentinels(self, hosts: Sequence[str] = ("redis1", "redis2", "redis3")) -> str:
        """``LLMQ_REDIS_SENTINELS`` for Sentinels on ``hosts``."""
        return ",".join(f"{self.hosts[h].address}:{SENTINEL_PORT}" for h in hosts)

    def wait_port(self, host: str, port: int, timeout: float = 15.0) -> None:
        """Until something accepts TCP on ``host``'s address (from the control address)."""
        import socket

        deadline = time.monotonic() + timeout
        address = self.hosts[host].address
        while True:
            try:
                with socket.create_connection((address, port), timeout=0.5):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    logs = "\n".join(
                        p.output()[-1500:] for p in self.processes if p.host.name == host
                    )
                    raise NetnsError(
                        f"nothing listens on {host} {address}:{port}\n{logs}"
                    ) from None
                time.sleep(0.05)

    # -- teardown --------------------------------------------------------------------

    def close(self) -> None:
        """Kill every process, remove namespaces and links; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        for proc in self.processes:
            proc.signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        for proc in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(max(0.0, deadline - time.monotonic()))
            proc.kill()
        for host in self.hosts.values():
            _kill_netns_pids(host.ns)
            _ip("netns", "del", host.ns, check=False)
            _ip("link", "del", host.link, check=False)
        if self.bridge:
            _ip("link", "del", self.bridge, check=False)
        shutil.rmtree(self.workdir, ignore_errors=True)
        atexit.unregister(self.close)

    def __enter__(self) -> Cluster:
        try:
            return self.create()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
