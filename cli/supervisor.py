"""A process manager: spawn children, prefix their output, restart them, stop them in order.

The one implementation of "run a child process and keep it running" in llmq:
``llmq run`` (:mod:`cli.stack`) uses it for the API and the workers, and its
local autoscaler adds and removes workers through it. Children run in their own
session, so a terminal's Ctrl-C (SIGINT to the foreground process group) reaches
only the supervisor, which then stops them in the order its owner chooses.

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
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import BinaryIO

log = logging.getLogger(__name__)

#: How long a child may take to stop after SIGTERM before it is killed.
STOP_TIMEOUT = 20.0
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM when the supervisor dies, even by
    SIGKILL, so that a killed supervisor leaves no orphan behind."""
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
