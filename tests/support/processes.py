"""Real llmq processes for end-to-end tests: start, wait until ready, stop, inspect."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from llmq.embedded import free_port


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any LLMQ_* setting of the caller, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMQ_")}
    env.update(extra)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Proc:
    """A child process whose combined output goes to a temporary file."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.log = Path(tempfile.mkstemp(prefix="llmq-proc-", suffix=".log")[1])
        self._out = self.log.open("wb")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "cli", *args],
            env=env,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def signal(self, sig: signal.Signals) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout)

    def stop(self, timeout: float = 30) -> int:
        self.signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            return self.popen.wait()
        finally:
            self._out.close()


def wait_for(
    condition: Callable[[], bool], timeout: float, what: str, proc: Proc | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc is not None and proc.popen.poll() is not None:
            raise AssertionError(f"process exited while waiting for {what}:\n{proc.output()}")
        if time.monotonic() > deadline:
            tail = proc.output()[-3000:] if proc else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{tail}")
        time.sleep(0.05)


def live_workers(url: str) -> int:
    try:
        r = httpx.get(url + "/v1/workers", timeout=1)
    except httpx.HTTPError:
        return -1
    return len(r.json()["data"]) if r.status_code == 200 else -1


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid``, from /proc."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid:
            out.append(int(entry.name))
    return out


def alive(pid: int) -> bool:
    """Running (a zombie counts as gone: it has exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def reap(pids: list[int]) -> None:
    """Best effort: SIGKILL leftovers so a failed test does not leak processes."""
    for pid in pids:
        if alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def start_run(*args: str, **env: str) -> tuple[str, Proc]:
    port = free_port()
    proc = Proc(["run", "--port", str(port), *args], clean_env(**env))
    return f"http://127.0.0.1:{port}", proc
