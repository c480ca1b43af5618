"""A worker whose upstream stops answering stops claiming, and hands its requests back.

The worker's model is a server beside it; when that server dies or hangs, the
worker is useless, but alive: its heartbeat would keep its leases and its claims
would keep taking requests it cannot run. :class:`UpstreamWatch` probes the
upstream every ``interval`` seconds, and at once when a stream fails (the
adapter's ``on_down``: claiming stops before the probe confirms). While the
upstream is down the worker claims nothing, its running requests are handed back
(:meth:`~worker.runner.RequestRunner.hand_back`: arq requeues them, and another
worker resumes them from the tokens already published; each hand-back is an
attempt, bounded by ``LLMQ_MAX_TRIES``), and its registry entry says
``ready: false`` (``/readyz``, ``/v1/workers``). The first probe that answers puts it
back to work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from llmq.protocol.queue import Queue
from worker.backends.openai import OpenAIUpstream
from worker.queue_worker import QueueWorker

log = logging.getLogger(__name__)


class UpstreamWatch:
    def __init__(
        self,
        upstream: OpenAIUpstream,
        worker: QueueWorker,
        queue: Queue,
        *,
        interval: float,
        stop: asyncio.Event,
    ) -> None:
        self.upstream = upstream
        self.worker = worker
        self.queue = queue
        self.interval = interval
        self.stop = stop
        self.ready = True
        self._check = asyncio.Event()
        upstream.on_down = self.suspect

    def suspect(self) -> None:
        """A stream failed: claim nothing more until a probe says the upstream answers."""
        self.worker.allow_pick_jobs = False
        self._check.set()

    async def run(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval):
                    await self._check.wait()
            self._check.clear()
            if self.stop.is_set():
                return
            if await self.upstream.probe():
                self._up()
            else:
                await self._down()

    def _up(self) -> None:
        if not self.ready:
            log.info("upstream %s answers again: claiming", self.upstream.url)
        self.ready = True
        if not self.worker.allow_pick_jobs and not self.stop.is_set() and not self.worker.draining:
            self.worker.allow_pick_jobs = True
            self.worker.wake.set()

    async def _down(self) -> None:
        self.worker.allow_pick_jobs = False
        if not self.ready:
            return
        self.ready = False
        running = list(self.worker.runner.runs)
        log.warning(
            "upstream %s does not answer: claiming stops, %d running requests handed back",
            self.upstream.url,
            len(running),
        )
        for request_id in running:
            self.worker.runner.hand_back(request_id)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2):
                await self.queue.unpark(self.worker.model, self.worker.worker_id)
