"""A process manager: spawn children, prefix their output, restart them, stop them in order.

The one implementation of "run a child process" in llmq: ``llmq run``
(:mod:`cli.stack`) uses :class:`Supervisor` for the API and the workers, and its
local autoscaler adds and removes workers through it; the benchmarks
(:mod:`bench.procs`) and the tests start theirs as :class:`LoggedProcess`, with
:func:`wait_for` to wait until they are ready and :func:`stop_all` to stop them.
Children run in their own session, so a terminal's Ctrl-C (SIGINT to the
foreground process group) reaches only their parent, which then stops them in the
order it chooses; and each gets SIGTERM when its parent dies, even by SIGKILL, so a
killed parent leaves no orphan behind.

A child that exits while nobody asked it to is restarted after a backoff that
doubles with each recent restart (``backoff_seconds`` up to ``backoff_max_seconds``),
with a log line that names it, its exit status and what happens next. A child
that needs ``limit`` restarts within ``window_seconds`` is in a crash loop: the
supervisor stops restarting and sets :attr:`Supervisor.failed`, and its owner
stops the whole stack with a non-zero exit code and the message in
:attr:`Supervisor.failure`. A stack that silently keeps one part down is worse
than a clear failure, and one that stops for a single crash is fragile.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import httpx

log = logging.getLogger(__name__)

#: How long a child may take to stop after SIGTERM before it is killed.
STOP_TIMEOUT = 20.0
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM when its parent dies, even by
    SIGKILL, so that a killed parent leaves no orphan behind."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))


@dataclass(frozen=True)
class RestartPolicy:
    """When a child that died is restarted, and when the supervisor gives up."""

    limit: int = 5
    window_seconds: float = 60.0
    backoff_seconds: float = 0.5
    backoff_max_seconds: float = 10.0

    def delay(self, recent: int) -> float:
        """Backoff before the restart that follows ``recent`` restarts in the window."""
        return float(min(self.backoff_seconds * 2**recent, self.backoff_max_seconds))


def describe_exit(code: int) -> str:
    """``exit status 3`` or ``signal SIGKILL``, as a log line should say it."""
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"


@dataclass(eq=False)
class Child:
    """One supervised process slot; its process is replaced on each restart."""

    name: str
    argv: list[str]
    env: dict[str, str]
    restart: bool = True
    process: asyncio.subprocess.Process | None = None
    started_at: float = 0.0
    #: Set when the supervisor was asked to stop it: its exit is then expected.
    stopping: bool = False
    restarts: deque[float] = field(default_factory=deque)
    _pump: asyncio.Task[None] | None = None
    _watch: asyncio.Task[None] | None = None
    #: Set once the child has exited for good (stopped, or not restarted).
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    _stop_requested: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None


class Supervisor:
    """Owns its children; :meth:`close` stops whatever is still running."""

    def __init__(self, policy: RestartPolicy | None = None, out: BinaryIO | None = None) -> None:
        self.policy = policy or RestartPolicy()
        self.children: dict[str, Child] = {}
        self.failed = asyncio.Event()
        self.failure: str | None = None
        self._out = out or sys.stdout.buffer
        self._closing = False

    async def start(
        self, name: str, argv: list[str], env: dict[str, str], *, restart: bool = True
    ) -> Child:
        """Spawn ``argv`` as ``name`` (unique among live children) and watch it."""
        if name in self.children:
            raise ValueError(f"a child named {name!r} is already supervised")
        child = Child(name, argv, env, restart)
        self.children[name] = child
        await self._spawn(child)
        child._watch = asyncio.create_task(self._supervise(child), name=f"watch-{name}")
        return child

    async def _spawn(self, child: Child) -> None:
        process = await asyncio.create_subprocess_exec(
            *child.argv,
            env=child.env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        if process.stdout is None:  # pragma: no cover - PIPE always gives a reader
            raise RuntimeError("child has no stdout")
        child.process = process
        child.started_at = time.monotonic()
        child._pump = asyncio.create_task(self._copy(child.name, process.stdout))

    async def _copy(self, name: str, stream: asyncio.StreamReader) -> None:
        prefix = f"[{name}] ".encode()
        while line := await stream.readline():
            self._out.write(prefix + line)
            self._out.flush()

    async def _supervise(self, child: Child) -> None:
        try:
            while True:
                process = child.process
                if process is None:  # pragma: no cover - set before the watch starts
                    return
                code = await process.wait()
                if child._pump is not None:
                    await child._pump
                if child.stopping or self._closing:
                    return
                if not child.restart:
                    self._fail(
                        f"{child.name} (pid {process.pid}) exited with {describe_exit(code)}"
                    )
                    return
                if not await self._restart(child, process.pid, code):
                    return
        finally:
            self.children.pop(child.name, None)
            child.ended.set()

    async def _restart(self, child: Child, pid: int, code: int) -> bool:
        policy = self.policy
        now = time.monotonic()
        while child.restarts and now - child.restarts[0] > policy.window_seconds:
            child.restarts.popleft()
        recent = len(child.restarts)
        if recent >= policy.limit:
            self._fail(
                f"{child.name} (pid {pid}) exited with {describe_exit(code)} after {recent} "
                f"restarts within {policy.window_seconds:g}s: crash loop, stopping the stack"
            )
            return False
        delay = policy.delay(recent)
        log.error(
            "%s (pid %d) exited unexpectedly with %s; restarting it in %.1fs "
            "(restart %d of at most %d within %gs)",
            child.name,
            pid,
            describe_exit(code),
            delay,
            recent + 1,
            policy.limit,
            policy.window_seconds,
        )
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await child._stop_requested.wait()
        if child.stopping or self._closing:
            return False
        child.restarts.append(time.monotonic())
        await self._spawn(child)
        log.info("%s restarted (pid %s)", child.name, child.pid)
        if child.stopping and child.process is not None:  # asked to stop while spawning
            with contextlib.suppress(ProcessLookupError):
                child.process.send_signal(signal.SIGTERM)
        return True

    def _fail(self, message: str) -> None:
        if self.failure is None:
            self.failure = message
        log.error("%s", message)
        self.failed.set()

    async def until_stopped(self, stop: asyncio.Event) -> str | None:
        """Wait until ``stop`` is set or a child is in a crash loop; the crash loop's
        message, or None when asked to stop."""
        stopper = asyncio.create_task(stop.wait())
        failed = asyncio.create_task(self.failed.wait())
        try:
            await asyncio.wait({stopper, failed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
            failed.cancel()
        return self.failure

    async def stop(self, children: list[Child], timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM to each (at once), then wait; a child still running after ``timeout``
        is killed. A stopped child is not restarted."""
        for child in children:
            child.stopping = True
            child._stop_requested.set()
            if child.alive and child.process is not None:
                with contextlib.suppress(ProcessLookupError):
                    child.process.send_signal(signal.SIGTERM)
        for child in children:
            process = child.process
            if process is not None:
                try:
                    async with asyncio.timeout(timeout):
                        await process.wait()
                except TimeoutError:
                    log.warning("%s did not stop in %.0fs; killing it", child.name, timeout)
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
                    await process.wait()
            if child._watch is not None:
                await child._watch
            if child.process is not None and child.process is not process:
                await child.process.wait()  # respawned while the stop was on its way

    async def close(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop every remaining child at once (owners stop them in order first)."""
        self._closing = True
        await self.stop(list(self.children.values()), timeout)


def llmq_command(*args: str) -> list[str]:
    """The command line of an ``llmq`` child (``llmq_command("worker")``), run by
    this interpreter."""
    return [sys.executable, "-m", "cli", *args]


def stop_signals() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT (in the running loop): how a supervising
    command learns that it should stop its children."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without the caller's LLMQ_* settings, plus ``extra``.

    A child then runs with exactly the settings it is given, whatever the shell
    that started its parent exported.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMQ_")}
    env.update(extra)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class NotReady(RuntimeError):
    """A process exited, or a condition did not hold in time, while waiting for it."""


class LoggedProcess:
    """A child that is not restarted, with its combined output appended to ``log``.

    For processes whose owner watches them itself (a benchmark's stack, a test's
    server): it runs in its own session and dies with its parent, like a
    supervised child.
    """

    def __init__(
        self,
        argv: list[str],
        env: Mapping[str, str],
        log: Path,
        *,
        name: str | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name or Path(argv[0]).name
        self.log = log
        self._out = log.open("ab")
        self.popen = subprocess.Popen(
            argv,
            env=dict(env),
            cwd=cwd,
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

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, chars: int = 3000) -> str:
        return self.output()[-chars:]

    def signal(self, sig: signal.Signals) -> None:
        if self.running():
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(sig)

    def terminate(self) -> None:
        self.signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout)

    def wait_stopped(self, timeout: float = STOP_TIMEOUT) -> int:
        """Wait for the exit after :meth:`terminate`; SIGKILL if it takes too long."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop in %.0fs; killing it", self.name, timeout)
            self.popen.kill()
            return self.popen.wait()
        finally:
            self._out.close()

    def stop(self, timeout: float = STOP_TIMEOUT) -> int:
        self.terminate()
        return self.wait_stopped(timeout)


def stop_all(processes: Iterable[LoggedProcess], timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM every process at once, then wait for each (so their drains overlap)."""
    processes = list(processes)
    for process in processes:
        process.terminate()
    for process in processes:
        process.wait_stopped(timeout)


def wait_for(
    condition: Callable[[], bool],
    timeout: float,
    what: str,
    *watched: LoggedProcess | None,
    interval: float = 0.05,
) -> None:
    """Poll ``condition`` until true; raise :class:`NotReady` at the deadline, or at
    once if a ``watched`` process exits, with the tail of its output."""
    deadline = time.monotonic() + timeout
    procs = [p for p in watched if p is not None]
    while not condition():
        for process in procs:
            if not process.running():
                raise NotReady(f"{process.name} exited while waiting for {what}:\n{process.tail()}")
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name}\n{p.tail(1500)}" for p in procs)
            raise NotReady(f"timed out after {timeout:g}s waiting for {what}\n{tails}")
        time.sleep(interval)


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid``, from /proc (the servers of ``llmq api --api-processes``)."""
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


def alive(pid: int) -> bool:
    """Running (a zombie counts as gone: it has exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def reap(pids: Iterable[int]) -> None:
    """Best effort: SIGKILL whatever of ``pids`` still runs, so nothing leaks."""
    for pid in pids:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def http_status(url: str) -> int:
    """The status of ``GET url``, -1 when nothing answers."""
    try:
        return httpx.get(url, timeout=1.0).status_code
    except httpx.HTTPError:
        return -1


def live_workers(url: str) -> int:
    """How many workers the API at ``url`` lists (-1 when it does not answer)."""
    try:
        response = httpx.get(url + "/v1/workers", timeout=1.0)
    except httpx.HTTPError:
        return -1
    return len(response.json()["data"]) if response.status_code == 200 else -1
