"""What the machine was and how busy it was: the context every figure needs.

A latency or throughput figure from a shared 2-core machine means little unless
the reader can tell whether the CPU was the limit, so the suite samples
``/proc/stat`` around runs (whole-machine utilisation, which includes the load
generator and any noisy neighbour) and ``/proc/<pid>/stat`` per process (CPU
seconds of the API and the workers). Redis reports its own CPU through
``INFO cpu``, which avoids guessing which pid is the server.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, cast

import redis

from bench.procs import ROOT

_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class CpuSample:
    """Jiffies from the first line of ``/proc/stat``: busy (not idle/iowait) and total."""

    busy: int
    total: int

    @staticmethod
    def now() -> CpuSample:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        total = sum(fields[:8])  # user..steal; guest time is already inside user
        return CpuSample(total - idle, total)


def utilisation(before: CpuSample, after: CpuSample) -> float:
    """Share of all cores' time that was busy between two samples (0..1)."""
    total = after.total - before.total
    return (after.busy - before.busy) / total if total > 0 else 0.0


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of one process (None once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime (fields 14, 15)


def redis_cpu_seconds(url: str) -> float:
    """``used_cpu_sys + used_cpu_user`` of the Redis server (main thread and children)."""
    client = redis.Redis.from_url(url)
    try:
        info = cast(dict[str, Any], client.info("cpu"))
    finally:
        client.close()
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def redis_version(url: str) -> str:
    client = redis.Redis.from_url(url)
    try:
        info = cast(dict[str, Any], client.info("server"))
    finally:
        client.close()
    return str(info["redis_version"])


class CpuMeter:
    """CPU seconds per role (``api``, ``workers``, ``redis``...) and machine utilisation.

    ``start`` then ``stop``; ``pids`` maps a name to a pid, names starting with
    ``worker`` are summed into ``workers``, names starting with ``api`` into
    ``api``. ``cpus_ours`` is the measured processes' CPU per wall second,
    ``cpus_others`` what the rest of the machine used meanwhile (neighbours on a
    shared host): together they tell whether the stack or a neighbour used up the
    cores.
    """

    def __init__(self, pids: dict[str, int], redis_url: str | None) -> None:
        self.pids = pids
        self.redis_url = redis_url
        self._machine = CpuSample.now()
        self._procs: dict[str, float] = {}
        self._redis = 0.0
        self._wall = time.monotonic()
        self.result: dict[str, float] = {}

    def start(self) -> CpuMeter:
        self._procs = {name: process_cpu_seconds(pid) or 0.0 for name, pid in self.pids.items()}
        self._redis = redis_cpu_seconds(self.redis_url) if self.redis_url else 0.0
        self._machine = CpuSample.now()
        self._wall = time.monotonic()
        return self

    def stop(self) -> dict[str, float]:
        machine = CpuSample.now()
        roles: dict[str, float] = {}
        for name, pid in self.pids.items():
            seconds = (process_cpu_seconds(pid) or 0.0) - self._procs.get(name, 0.0)
            role = "workers" if name.startswith("worker") else name
            role = "api" if role.startswith("api") else role
            if role != "redis":  # Redis is measured by INFO below
                roles[role] = roles.get(role, 0.0) + seconds
        if self.redis_url:
            roles["redis"] = redis_cpu_seconds(self.redis_url) - self._redis
        wall = time.monotonic() - self._wall
        ours = sum(roles.values())
        roles["wall_s"] = wall
        roles["machine_utilisation"] = utilisation(self._machine, machine)
        roles["cpus_busy"] = roles["machine_utilisation"] * (os.cpu_count() or 1)
        roles["cpus_ours"] = ours / wall if wall > 0 else 0.0
        roles["cpus_others"] = max(0.0, roles["cpus_busy"] - roles["cpus_ours"])
        self.result = roles
        return roles


def _git(*args: str) -> str:
    try:
        out = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "missing"


def machine_info(redis_url: str | None = None) -> dict[str, Any]:
    """Everything a reader needs to judge where the numbers come from."""
    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "loadavg_at_start": list(os.getloadavg()),
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "packages": {p: _version(p) for p in ("arq", "redis", "uvicorn", "httpx", "fastapi")},
    }
    if redis_url:
        info["redis_version"] = redis_version(redis_url)
    return info
