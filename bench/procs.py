"""Real local processes for a benchmark: Redis, one ``llmq api``, N ``llmq worker``.

The benchmark measures the system as it is deployed, so everything runs as a
separate process started the way an operator would (``python -m cli api``,
``python -m cli worker``, settings as ``LLMQ_*`` variables). Orchestration is
synchronous and every process is owned by a context manager, so an error or a
Ctrl-C anywhere unwinds through ``__exit__`` and stops them all: SIGTERM first
(workers drain, uvicorn closes), SIGKILL only after a grace period. The processes
are :class:`cli.supervisor.LoggedProcess` children: in their own session (a
terminal's Ctrl-C reaches only the benchmark, which then stops them in order) and
stopped by the kernel when the benchmark dies, even by SIGKILL.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Self

from cli import supervisor
from cli.supervisor import (
    LoggedProcess,
    NotReady,
    children_of,
    http_status,
    stop_all,
    wait_for,
)
from cli.supervisor import live_workers as live_workers
from llmq.embedded import EmbeddedRedis, free_port

ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT = 60.0

#: The mock's answers run to max_tokens, as every figure so far was measured: the
#: default mean length (a model that stops by itself) would change what is compared.
#: A request without max_tokens then runs to 128 tokens, not to the limit (4096).
FIXED_LENGTHS = {"LLMQ_MODEL_MEAN_TOKENS": "0", "LLMQ_DEFAULT_MAX_TOKENS": "128"}


def clean_env(**extra: str) -> dict[str, str]:
    """The supervisor's clean environment, with the mock at :data:`FIXED_LENGTHS`
    unless ``extra`` says otherwise."""
    return supervisor.clean_env(**{**FIXED_LENGTHS, **extra})


#: A process failed to start or to become ready.
BenchError = NotReady


class BenchProcess(LoggedProcess):
    """``python -m MODULE ARGS`` run from ``ROOT``, its output in ``log_dir/<name>.log``.

    ``ROOT`` is read at each start: a ``--compare`` run points it at another
    checkout, whose code the processes then run.
    """

    def __init__(self, name: str, args: list[str], env: Mapping[str, str], log_dir: Path) -> None:
        if args and args[0] == "cli" and not (ROOT / "cli").is_dir():
            # an older checkout (``--compare``): its command module was ``llmq``
            args = ["llmq", *args[1:]]
        super().__init__(
            [sys.executable, "-m", *args], env, log_dir / f"{name}.log", name=name, cwd=ROOT
        )


def _wait_healthy(url: str, what: str, process: BenchProcess) -> None:
    wait_for(lambda: http_status(url + "/healthz") == 200, READY_TIMEOUT, what, process)


class _Processes:
    """Processes started together and stopped in order, with their embedded Redis.

    The one start and stop of every set of benchmark processes: as a context
    manager it starts Redis (if any), then :meth:`_start` the processes; a start
    that fails stops what already runs, and so does ``__exit__``: :meth:`_stop`
    the processes, in their order, then Redis, even if a stop failed.
    """

    redis: EmbeddedRedis | None

    def _start(self) -> None:
        raise NotImplementedError

    def _stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            if self.redis is not None:
                self.redis.start()
            self._start()
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
        try:
            self._stop()
        finally:
            if self.redis is not None:
                self.redis.stop()


class Stack(_Processes):
    """An embedded Redis, one API process and a resizable set of worker processes.

    ``api_env`` and the ``worker_env`` given to :meth:`scale` are ``LLMQ_*``
    settings (without the prefix handling: pass full variable names).
    """

    redis: EmbeddedRedis

    def __init__(self, log_dir: Path, api_env: Mapping[str, str] | None = None) -> None:
        self.log_dir = log_dir
        self.api_env = dict(api_env or {})
        self.redis = EmbeddedRedis()
        self.port = free_port()
        self.api: BenchProcess | None = None
        self.workers: list[BenchProcess] = []
        self._worker_env: dict[str, str] = {}
        self._started = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _env(self, extra: Mapping[str, str]) -> dict[str, str]:
        return clean_env(LLMQ_REDIS_URL=self.redis.url, **extra)

    def _start(self) -> None:
        env = self._env({**self.api_env, "LLMQ_PORT": str(self.port)})
        self.api = BenchProcess("api", ["cli", "api"], env, self.log_dir)
        _wait_healthy(self.url, "the API", self.api)

    def _stop(self) -> None:
        """Workers first (they drain), then the API."""
        stop_all(self.workers)
        self.workers = []
        if self.api is not None:
            self.api.stop()
            self.api = None

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
            child = BenchProcess(
                f"worker-{self._started}", ["cli", "worker"], self._env(env), self.log_dir
            )
            self.workers.append(child)
        assert self.api is not None
        wait_for(
            lambda: live_workers(self.url) == count,
            READY_TIMEOUT,
            f"{count} live workers",
            self.api,
            *self.workers,
        )

    def add_worker(self, worker_env: Mapping[str, str]) -> None:
        """One more worker with its own settings (``scale`` gives every worker the same:
        a worker driving its own inference server needs its own upstream URL)."""
        self._started += 1
        child = BenchProcess(
            f"worker-{self._started}", ["cli", "worker"], self._env(worker_env), self.log_dir
        )
        self.workers.append(child)
        count = len(self.workers)
        assert self.api is not None
        wait_for(
            lambda: live_workers(self.url) == count,
            READY_TIMEOUT,
            f"{count} live workers",
            self.api,
            *self.workers,
        )

    def pids(self) -> dict[str, int]:
        """Process ids by role, for CPU accounting."""
        out = {c.name: c.pid for c in self.workers}
        if self.api is not None:
            out["api"] = self.api.pid
            # With LLMQ_API_PROCESSES > 1 the API's servers are its children.
            for i, pid in enumerate(children_of(self.api.pid)):
                out[f"api-{i + 1}"] = pid
        if self.redis.process is not None:
            out["redis"] = self.redis.process.pid
        return out


class FloorServer(_Processes):
    """The floor (:mod:`bench.floor`) as its own process, with the model's timing.

    ``via_redis``: the floor through one Redis hop instead (:mod:`bench.floor_via_redis`),
    with a Redis of its own; ``model_apart``: its model in a second process
    (``--role model``) fed through Redis, as llmq's workers are; ``upstream``: that
    process in front of this OpenAI-compatible server instead of the mock.
    """

    def __init__(
        self,
        log_dir: Path,
        tokens_per_second: float,
        prefill_seconds: float,
        *,
        via_redis: bool = False,
        model_apart: bool = False,
        upstream: str | None = None,
    ) -> None:
        self.log_dir = log_dir
        self.port = free_port()
        self.model_apart = model_apart or upstream is not None
        self.redis = EmbeddedRedis() if via_redis or self.model_apart else None
        self.upstream = upstream
        self.pace = [
            "--tokens-per-second",
            str(tokens_per_second),
            "--prefill-seconds-per-token",
            str(prefill_seconds),
        ]
        self.child: BenchProcess | None = None
        self.model: BenchProcess | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def redis_url(self) -> str | None:
        return self.redis.url if self.redis is not None else None

    def _start(self) -> None:
        if self.redis is None:
            args = ["bench.floor", "--port", str(self.port), *self.pace]
        else:
            relay = ["bench.floor_via_redis", "--redis-url", self.redis.url]
            if self.model_apart:
                model = [*relay, "--role", "model", *self.pace]
                if self.upstream is not None:
                    model += ["--upstream", self.upstream]
                self.model = BenchProcess("floor-model", model, clean_env(), self.log_dir)
            role = "api" if self.model_apart else "both"
            args = [*relay, "--role", role, "--port", str(self.port), *self.pace]
        self.child = BenchProcess("floor", args, clean_env(), self.log_dir)
        _wait_healthy(self.url, "the floor", self.child)

    def _stop(self) -> None:
        """The server and its model."""
        stop_all([p for p in (self.child, self.model) if p is not None])
        self.child = self.model = None

    def pids(self) -> dict[str, int]:
        """Process ids by role (Redis's CPU is read from Redis itself)."""
        out = {"floor": self.child.pid} if self.child is not None else {}
        if self.model is not None:
            out["model"] = self.model.pid
        return out
