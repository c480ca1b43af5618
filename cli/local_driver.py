"""The local driver of ``llmq run --autoscale MIN:MAX``: worker processes of this machine.

It starts ``llmq worker`` processes through the stack's
:class:`~cli.supervisor.Supervisor` and stops them with SIGTERM, so a scale-in is
the worker's drain: running requests finish (or go back to the queue at their
score after ``LLMQ_DRAIN_SECONDS``), no stream is cut. It prefers to stop a worker
that has not registered yet, then the one whose prefix cache is worth least (the
fewest prompt tokens served from it), then the one running the fewest requests
(:func:`stop_first`): with cache-aware routing the others keep the prefixes that
traffic comes back for.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Awaitable, Callable

from cli.supervisor import Child, Supervisor
from llmq.schema import WorkerInfo

log = logging.getLogger(__name__)


def stop_first(info: WorkerInfo | None, started_at: float) -> tuple[int, int, int, float]:
    """A worker's place in the scale-in order (lowest stops first): unregistered, then
    the least cache hits, then the least busy, then the newest."""
    if info is None:
        return (0, 0, 0, -started_at)
    return (1, info.prefix_cache_hits, info.running, -started_at)


class LocalDriver:
    """Worker processes of this machine, started and stopped through the supervisor."""

    def __init__(self, supervisor: Supervisor, spawn: Callable[[], Awaitable[Child]]) -> None:
        self.supervisor = supervisor
        self._spawn = spawn
        self.workers: list[Child] = []
        self._host = socket.gethostname()
        self._registered: dict[int, float] = {}
        self._startup: float | None = None
        self._stopping: set[asyncio.Task[None]] = set()

    def adopt(self, child: Child) -> None:
        """A worker the stack started itself (the initial ``MIN``)."""
        self.workers.append(child)

    def active(self) -> list[Child]:
        return [c for c in self.workers if not c.stopping and not c.ended.is_set()]

    def _live_pids(self, live: tuple[WorkerInfo, ...]) -> dict[int, WorkerInfo]:
        return {w.pid: w for w in live if w.host == self._host}

    def starting(self, model: str, live: tuple[WorkerInfo, ...]) -> int:
        pids = self._live_pids(live)
        count = 0
        # the worker's entry says when it registered (wall clock): the start-up is
        # measured to that instant, not to the control period that noticed it
        wall_offset = time.time() - time.monotonic()
        for child in self.active():
            pid = child.pid
            if pid in pids:
                if pid not in self._registered:
                    took = max(pids[pid].started_at - (child.started_at + wall_offset), 0.0)
                    self._registered[pid] = took
                    self._startup = (
                        took if self._startup is None else 0.7 * self._startup + 0.3 * took
                    )
            else:
                count += 1
        return count

    def startup_seconds(self) -> float | None:
        return self._startup

    async def scale(self, model: str, target: int, live: tuple[WorkerInfo, ...]) -> None:
        active = self.active()
        for _ in range(target - len(active)):
            self.workers.append(await self._spawn())
        surplus = len(active) - target
        if surplus <= 0:
            return
        pids = self._live_pids(live)

        def order(child: Child) -> tuple[int, int, int, float]:
            return stop_first(pids.get(child.pid or -1), child.started_at)

        for child in sorted(active, key=order)[:surplus]:
            log.info(
                "scale-in: stopping %s (pid %s) with SIGTERM (it drains)", child.name, child.pid
            )
            task = asyncio.create_task(self.supervisor.stop([child]))
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)
        self.workers = [c for c in self.workers if not c.stopping]

    async def close(self) -> None:
        if self._stopping:
            await asyncio.wait(set(self._stopping))
