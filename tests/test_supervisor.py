"""The process manager: restart with backoff, crash loop, deliberate stops stay stopped."""

from __future__ import annotations

import io
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli.supervisor import RestartPolicy, Supervisor, describe_exit
from tests.support.processes import alive, reap
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(30)

SLEEPER = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"]
CRASHER = [sys.executable, "-c", "import sys; print('crash', flush=True); sys.exit(3)"]


def test_describe_exit() -> None:
    assert describe_exit(3) == "exit status 3"
    assert describe_exit(-9) == "signal SIGKILL"


def test_backoff_doubles_up_to_its_cap() -> None:
    policy = RestartPolicy(backoff_seconds=0.5, backoff_max_seconds=3)
    assert [policy.delay(n) for n in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]


async def test_a_killed_child_is_restarted_with_a_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    out = io.BytesIO()
    supervisor = Supervisor(RestartPolicy(backoff_seconds=0.05), out=out)
    child = await supervisor.start("sleeper", SLEEPER, dict(os.environ))
    try:
        first = child.pid
        assert first is not None
        await wait_until(lambda: b"[sleeper] up" in out.getvalue(), timeout=10, what="output")
        with caplog.at_level(logging.INFO, logger="cli.supervisor"):
            os.kill(first, signal.SIGKILL)
            await wait_until(
                lambda: child.pid != first and child.alive, timeout=10, what="a restart"
            )
        assert not supervisor.failed.is_set()
        line = next(r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
        assert "sleeper" in line and str(first) in line and "signal SIGKILL" in line
        assert "restarting it in" in line
    finally:
        await supervisor.close()
    assert child.ended.is_set() and not alive(child.pid or 0)


async def test_a_crash_loop_fails_with_a_clear_message() -> None:
    supervisor = Supervisor(
        RestartPolicy(limit=3, window_seconds=60, backoff_seconds=0.01), out=io.BytesIO()
    )
    child = await supervisor.start("crasher", CRASHER, dict(os.environ))
    try:
        await wait_until(supervisor.failed.is_set, timeout=20, what="the crash loop")
        assert supervisor.failure is not None
        assert "crasher" in supervisor.failure and "exit status 3" in supervisor.failure
        assert "crash loop" in supervisor.failure and "3 restarts within 60s" in supervisor.failure
        assert len(child.restarts) == 3
        await wait_until(child.ended.is_set, timeout=5, what="the child to be given up")
    finally:
        await supervisor.close()


async def test_a_stopped_child_is_not_restarted() -> None:
    supervisor = Supervisor(RestartPolicy(backoff_seconds=0.01), out=io.BytesIO())
    child = await supervisor.start("sleeper", SLEEPER, dict(os.environ))
    pid = child.pid
    await supervisor.stop([child], timeout=5)
    assert child.ended.is_set() and child.pid == pid and not child.alive
    assert "sleeper" not in supervisor.children and not supervisor.failed.is_set()
    await supervisor.close()


def test_children_die_with_a_killed_supervisor(tmp_path: Path) -> None:
    """A supervisor killed with SIGKILL (no chance to stop anything) leaves no orphan."""
    script = tmp_path / "supervise.py"
    script.write_text(
        "import asyncio, os, sys\n"
        "from cli.supervisor import Supervisor\n"
        "async def main():\n"
        "    s = Supervisor()\n"
        f"    c = await s.start('sleeper', {SLEEPER!r}, dict(os.environ))\n"
        "    print(c.pid, flush=True)\n"
        "    await asyncio.sleep(60)\n"
        "asyncio.run(main())\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        # the child is past its output (a dead pipe would not be what stops it)
        assert proc.stdout.readline().startswith("[sleeper] up")
        assert alive(child)
        proc.kill()
        proc.wait(10)
        deadline = time.monotonic() + 10
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child), "the child outlived its supervisor"
    finally:
        proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
        reap([child] if "child" in locals() else [])
