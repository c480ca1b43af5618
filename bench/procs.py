"""Real local processes for a benchmark: Redis, one ``llmq api``, N ``llmq worker``.

The benchmark measures the system as it is deployed, so everything runs as a
separate process started the way an operator would (``python -m cli api``,
``python -m cli worker``, settings as ``LLMQ_*`` variables). Orchestration is
synchronous and every process is owned by a context manager, so an error or a
Ctrl-C anywhere unwinds through ``__exit__`` and stops them all: SIGTERM first
(workers drain, uvicorn closes), SIGKILL only after a grace period. Each child
also gets ``PR_SET_PDEATHSIG`` so that even a SIGKILLed benchmark leaves nothing
behind. Children run in their own session: a terminal's Ctrl-C reaches only the
benchmark, which then stops them in order rather than all at once.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType

import httpx

from llmq.embedded import EmbeddedRedis, free_port

ROOT = Path(__file__).resolve().parent.parent
STOP_TIMEOUT = 20.0
READY_TIMEOUT = 60.0
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the benchmark process dies."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without the caller's LLMQ_* settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMQ_")}
    env.update(extra)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class BenchError(RuntimeError):
    """A process failed to start or to become ready."""


class Child:
    """``python -m MODULE ARGS`` with its output in ``log_dir/<name>.log``."""

    def __init__(self, name: str, args: list[str], env: Mapping[str, str], log_dir: Path) -> None:
        self.name = name
        self.log = log_dir / f"{name}.log"
        self._out = self.log.open("ab")
        if args and args[0] == "cli" and not (ROOT / "cli").is_dir():
            # an older checkout (``--compare``): its command module was ``llmq``
            args = ["llmq", *args[1:]]
        self.popen = subprocess.Popen(
            [sys.executable, "-m", *args],
            env=dict(env),
            cwd=ROOT,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def running(self) -> bool:
        return self.popen.poll() is None

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def terminate(self) -> None:
        if self.running():
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signal.SIGTERM)

    def wait_stopped(self, timeout: float = STOP_TIMEOUT) -> None:
        """Wait for the exit after :meth:`terminate`; SIGKILL if it takes too long."""
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
        finally:
            self._out.close()

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        self.terminate()
        self.wait_stopped(timeout)


def stop_all(children: list[Child]) -> None:
    """SIGTERM every child at once, then wait for each (so drains overlap)."""
    for child in children:
        child.terminate()
    for child in children:
        child.wait_stopped()


def wait_for(condition: Callable[[], bool], what: str, watched: list[Child]) -> None:
    """Poll ``condition`` until true; fail early if a watched child exits."""
    deadline = time.monotonic() + READY_TIMEOUT
    while not condition():
        for child in watched:
            if not child.running():
                raise BenchError(f"{child.name} exited while waiting for {what}:\n{child.tail()}")
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {c.name}\n{c.tail(1500)}" for c in watched)
            raise BenchError(f"timed out waiting for {what}\n{tails}")
        time.sleep(0.05)


class Stack:
    """An embedded Redis, one API process and a resizable set of worker processes.

    ``api_env`` and the ``worker_env`` given to :meth:`scale` are ``LLMQ_*``
    settings (without the prefix handling: pass full variable names).
    """

    def __init__(self, log_dir: Path, api_env: Mapping[str, str] | None = None) -> None:
        self.log_dir = log_dir
        self.api_env = dict(api_env or {})
        self.redis = EmbeddedRedis()
        self.port = free_port()
        self.api: Child | None = None
        self.workers: list[Child] = []
        self._worker_env: dict[str, str] = {}
        self._started = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _env(self, extra: Mapping[str, str]) -> dict[str, str]:
        return clean_env(LLMQ_REDIS_URL=self.redis.url, **extra)

    def __enter__(self) -> Stack:
        try:
            self.redis.start()
            env = self._env({**self.api_env, "LLMQ_PORT": str(self.port)})
            self.api = Child("api", ["cli", "api"], env, self.log_dir)
            wait_for(lambda: _status(self.url + "/healthz") == 200, "the API", [self.api])
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Workers first (they drain), then the API, then Redis."""
        try:
            stop_all(self.workers)
            self.workers = []
            if self.api is not None:
                self.api.stop()
                self.api = None
        finally:
            self.redis.stop()

    def scale(self, count: int, worker_env: Mapping[str, str] | None = None) -> None:
        """Run exactly ``count`` workers with ``worker_env``; wait until the API lists them.

        A change of environment restarts every worker; otherwise only the
        difference is started or stopped.
        """
        env = dict(worker_env) if worker_env is not None else self._worker_env
        if env != self._worker_env:
            stop_all(self.workers)
            self.workers = []
            self._worker_env = env
        if len(self.workers) > count:
            stop_all(self.workers[count:])
            del self.workers[count:]
        while len(self.workers) < count:
            self._started += 1
            child = Child(
                f"worker-{self._started}", ["cli", "worker"], self._env(env), self.log_dir
            )
            self.workers.append(child)
        assert self.api is not None
        wait_for(
            lambda: live_workers(self.url) == count,
            f"{count} live workers",
            [self.api, *self.workers],
        )

    def pids(self) -> dict[str, int]:
        """Process ids by role, for CPU accounting."""
        out = {c.name: c.pid for c in self.workers}
        if self.api is not None:
            out["api"] = self.api.pid
            # With LLMQ_API_PROCESSES > 1 the API's servers are its children.
            for i, pid in enumerate(children(self.api.pid)):
                out[f"api-{i + 1}"] = pid
        if self.redis.process is not None:
            out["redis"] = self.redis.process.pid
        return out


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (e.g. the server processes of ``llmq api --api-processes``)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(entry.name))
    return out


def _status(url: str) -> int:
    try:
        return httpx.get(url, timeout=1.0).status_code
    except httpx.HTTPError:
        return -1


def live_workers(url: str) -> int:
    """How many workers ``GET /v1/workers`` lists (-1 when the API does not answer)."""
    try:
        response = httpx.get(url + "/v1/workers", timeout=1.0)
    except httpx.HTTPError:
        return -1
    if response.status_code != 200:
        return -1
    return len(response.json()["data"])


class FloorServer:
    """The floor (:mod:`bench.floor`) as its own process, with the model's timing."""

    def __init__(self, log_dir: Path, tokens_per_second: float, prefill_seconds: float) -> None:
        self.log_dir = log_dir
        self.port = free_port()
        self.args = [
            "bench.floor",
            "--port",
            str(self.port),
            "--tokens-per-second",
            str(tokens_per_second),
            "--prefill-seconds-per-token",
            str(prefill_seconds),
        ]
        self.child: Child | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> FloorServer:
        self.child = Child("floor", self.args, clean_env(), self.log_dir)
        try:
            wait_for(lambda: _status(self.url + "/healthz") == 200, "the floor", [self.child])
        except BaseException:
            self.child.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.child is not None:
            self.child.stop()
            self.child = None

    def pids(self) -> dict[str, int]:
        return {"floor": self.child.pid} if self.child is not None else {}
