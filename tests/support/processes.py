"""Real llmq processes for end-to-end tests: start, wait until ready, stop, inspect.

They are :class:`cli.supervisor.LoggedProcess` children, started and waited for
with the same code as the benchmark's; this module adds only the test's way of
naming them (``Proc(["worker"], env)`` runs ``python -m cli worker``).
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from bench.procs import clean_env as clean_env
from cli.supervisor import LoggedProcess as LoggedProcess
from cli.supervisor import alive as alive
from cli.supervisor import children_of as children_of
from cli.supervisor import http_status as http_status
from cli.supervisor import live_workers as live_workers
from cli.supervisor import reap as reap
from cli.supervisor import wait_for as wait_for
from llmq.embedded import free_port


class Proc(LoggedProcess):
    """``python -m cli ARGS`` whose combined output goes to a temporary file."""

    def __init__(self, args: list[str], env: Mapping[str, str]) -> None:
        log = Path(tempfile.mkstemp(prefix="llmq-proc-", suffix=".log")[1])
        super().__init__([sys.executable, "-m", "cli", *args], env, log, name=" ".join(args[:1]))


def start_run(*args: str, **env: str) -> tuple[str, Proc]:
    port = free_port()
    proc = Proc(["run", "--port", str(port), *args], clean_env(**env))
    return f"http://127.0.0.1:{port}", proc


def start_api_process(redis_url: str, **env: str) -> tuple[str, Proc]:
    """``llmq api`` on a free port against ``redis_url`` (``env``: more ``LLMQ_*``
    settings): its URL and process, which a test may signal or kill."""
    port = free_port()
    return f"http://127.0.0.1:{port}", api_process_on(port, redis_url, **env)


def api_process_on(port: int, redis_url: str, **env: str) -> Proc:
    """``llmq api`` on ``port`` (a restart takes its predecessor's port)."""
    return Proc(["api"], clean_env(LLMQ_REDIS_URL=redis_url, LLMQ_PORT=str(port), **env))


def worker_process(redis_url: str, **settings: object) -> Proc:
    """``llmq worker`` against ``redis_url`` with ``settings`` (as ``LLMQ_*``)."""
    env = {f"LLMQ_{k.upper()}": str(v) for k, v in settings.items()}
    return Proc(["worker"], clean_env(LLMQ_REDIS_URL=redis_url, **env))


def logged_restart(output: str, name: str, pid: int) -> bool:
    """Whether the supervisor's ``output`` says it restarts ``name`` (pid ``pid``)
    after a SIGKILL."""
    line = (
        rf"{name} \(pid {pid}\) exited unexpectedly with signal SIGKILL; restarting it in [\d.]+s"
    )
    return re.search(line, output) is not None


async def llmq(redis_url: str, *args: str, **env: str) -> tuple[int, str, str]:
    """Run one ``llmq`` command (``python -m cli ARGS``) to its end against ``redis_url``:
    its exit code, stdout and stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "cli",
        *args,
        env={**os.environ, "LLMQ_REDIS_URL": redis_url, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    return int(proc.returncode or 0), out.decode(), err.decode()
