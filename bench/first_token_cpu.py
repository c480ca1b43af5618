"""Which process holds a CPU while a first token is on its way, read off the scheduler.

``python -m bench.first_token_cpu [REQUESTS]``: one ``llama-server`` (the tiny random
model of :mod:`rigs.llama`, pinned to the last CPU as in the ``upstream`` scenario's
"engine pinned" placement) and llmq 1+1 in front of it, llmq, Redis and this client
on the other CPUs. Requests go one at a time, first straight to the server, then
through llmq, each :data:`GAP_S` after the previous one ended, while ``perf sched
record`` (Linux's ``perf``, which needs root) logs every context switch on the
monotonic clock the client times its requests with. For each request's window, from
its send to its first content, it sums how long each process ran on each CPU, and
prints the medians per system: what a first token's time is made of, without
instrumenting any code (Python time, the kernel's work on a process's sockets, and
the CPU left idle while a process waits for another). ``--timeline`` also prints the
slices of the median request through llmq.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.procs import Stack
from bench.scenarios.upstream import Placement, Sizes, llmq_env, placed, server_url, start_servers
from loadgen.client import HttpTarget
from loadgen.measurements import StreamClock
from loadgen.workload import Workload
from rigs.llama import write_tiny_gguf

#: Pause between requests: each starts on a pipeline that finished the last one.
GAP_S = 0.02
WARMUP = 20
#: The timeline leaves out shorter slices (the server's threads hand over often).
MIN_S = 0.00005


@dataclass(frozen=True)
class Slice:
    """A process (or ``idle``) on a CPU from ``start`` to ``end`` (monotonic seconds)."""

    start: float
    end: float
    cpu: int
    who: str


async def _windows(url: str, count: int, seed: int) -> list[tuple[float, float]]:
    """Send ``count`` requests one at a time; each one's (send, first content) times."""
    config = Sizes().load(url, seed)
    target, workload = HttpTarget(config), Workload(config)
    await target.prepare()
    windows = []
    try:
        for i in range(count):
            await asyncio.sleep(GAP_S)
            clock = StreamClock()
            await target.send(workload.spec(i), clock)
            windows.append((clock.sent_at, clock.chunk_at[0]))
    finally:
        await target.aclose()
    return windows


@contextmanager
def _recording(path: Path) -> Iterator[None]:
    recorder = subprocess.Popen(
        ["perf", "sched", "record", "-k", "CLOCK_MONOTONIC", "-o", str(path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(1.0)  # perf is recording before the first request (it says nothing when)
        yield
    finally:
        recorder.send_signal(2)
        recorder.wait(60)


_TASK = re.compile(r"\[(\d+)(?:/(\d+))?\]")


def _slices(path: Path, roles: Mapping[int, str]) -> list[Slice]:
    """``perf sched timehist``: one line per switch, the task that ran until then."""
    out = subprocess.run(
        ["perf", "sched", "timehist", "-i", str(path)], capture_output=True, text=True, check=True
    ).stdout
    slices = []
    for line in out.splitlines()[3:]:
        fields = line.split()
        try:
            end, cpu, ran_ms = float(fields[0]), int(fields[1].strip("[]")), float(fields[-1])
        except (ValueError, IndexError):
            continue
        task = " ".join(fields[2:-3])
        match = _TASK.search(task)
        pid = int(match.group(2) or match.group(1)) if match else 0
        who = roles.get(pid) or ("idle" if "idle" in task else "other")
        slices.append(Slice(end - ran_ms / 1000, end, cpu, who))
    return slices


def _per_window(slices: list[Slice], windows: list[tuple[float, float]]) -> dict[str, list[float]]:
    """Per ``cpuN who``: milliseconds it ran within each window (0 where it did not)."""
    out: dict[str, list[float]] = {}
    for i, (sent, first) in enumerate(windows):
        ran: dict[str, float] = {}
        for s in slices:
            overlap = min(s.end, first) - max(s.start, sent)
            if overlap > 0:
                key = f"cpu{s.cpu} {s.who}"
                ran[key] = ran.get(key, 0.0) + overlap * 1000
        for key, ms in ran.items():
            out.setdefault(key, [0.0] * len(windows))[i] = ms
    out["first token"] = [(first - sent) * 1000 for sent, first in windows]
    return out


def _measure(
    count: int, log_dir: Path
) -> tuple[dict[str, dict[str, list[float]]], list[Slice], list[tuple[float, float]]]:
    model = write_tiny_gguf(log_dir / "tiny.gguf")
    placement = Placement.for_engines(1)
    if placement is None:
        raise SystemExit("needs two CPUs or more: the server on one, the rest on the others")
    results: dict[str, dict[str, list[float]]] = {}
    timeline: tuple[list[Slice], list[tuple[float, float]]] = ([], [])
    with placed(placement), Stack(log_dir) as stack:
        with start_servers(1, model, Sizes(), log_dir, placement) as (server,):
            stack.scale(1, llmq_env(server))
            roles = {pid: role.split("-")[0] for role, pid in stack.pids().items()}
            roles |= {server.pid: "llama-server", os.getpid(): "client"}
            # each system's prompts its own: the server reuses any prefix it has seen
            systems = {"direct": server_url(server), "llmq": stack.url}
            for seed, (name, url) in enumerate(systems.items()):
                asyncio.run(_windows(url, WARMUP, 100 + seed))
                data = log_dir / f"{name}.perf"
                with _recording(data):
                    windows = asyncio.run(_windows(url, count, seed))
                slices = _slices(data, roles)
                results[name] = _per_window(slices, windows)
                timeline = (slices, windows)  # llmq's, the last
    return results, *timeline


def _timeline(slices: list[Slice], windows: list[tuple[float, float]]) -> list[str]:
    """The switches of the request whose first token took the median time."""
    ranked = sorted(windows, key=lambda w: w[1] - w[0])
    sent, first = ranked[len(ranked) // 2]
    lines = [f"request through llmq, first token after {(first - sent) * 1000:.3f} ms:"]
    for s in sorted(slices, key=lambda s: s.start):
        if s.end > sent and s.start < first and s.who != "idle" and s.end - s.start >= MIN_S:
            lines.append(
                f"  {(s.start - sent) * 1000:8.3f} ms  +{(s.end - s.start) * 1000:6.3f} ms"
                f"  cpu{s.cpu} {s.who}"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("requests", nargs="?", type=int, default=200)
    parser.add_argument("--timeline", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="llmq-first-token-") as tmp:
        results, slices, windows = _measure(args.requests, Path(tmp))
    print(f"{args.requests} requests per system, one at a time; medians in ms per request")
    for name, per in results.items():
        print(f"{name}:")
        for key, values in sorted(per.items(), key=lambda kv: -statistics.median(kv[1])):
            median = statistics.median(values)
            if median >= 0.01:
                print(f"  {key:24} {median:7.3f}")
    if args.timeline:
        print("\n".join(_timeline(slices, windows)))


if __name__ == "__main__":
    main()
