"""The sweep that every API and worker process runs.

Each pass, one atomic script per job, so many processes running it never
double-handle a request:

- queued requests past their deadline are removed and ended with a
  ``queue_timeout`` error, whether or not any worker is alive to notice;
- running requests of the ``reap`` models whose worker stopped renewing their
  lease go back to the queue;
- requests attached to an API process that stopped renewing its lease (its
  OpenAI clients' connections died with it) are cancelled.

The last two judge liveness by leases, which nobody can renew while Redis is
unreachable. So after this process has seen Redis fail, it waits ``settle_seconds``
of good health before reaping again: long enough for every live process to have
renewed, so an outage does not pass for the death of everyone.
"""

from __future__ import annotations

import asyncio
import logging
import time

from llmq.queue import Queue

log = logging.getLogger(__name__)

#: Default settle time after an outage: longer than the worker and API heartbeats.
SETTLE_SECONDS = 2.5


class Health:
    """Whether this process's view of Redis has been good for long enough to reap."""

    def __init__(self, settle_seconds: float) -> None:
        self.settle = settle_seconds
        self.down = False
        #: When Redis came back after the last failure this process saw.
        self.recovered_at: float | None = None

    def failed(self) -> None:
        self.down = True

    def succeeded(self, now: float) -> None:
        if self.down:
            self.down = False
            self.recovered_at = now

    def settled(self, now: float) -> bool:
        if self.down:
            return False
        return self.recovered_at is None or now - self.recovered_at >= self.settle


async def sweep_once(queue: Queue, reap: tuple[str, ...], health: Health) -> None:
    expired = await queue.sweep()
    health.succeeded(time.monotonic())
    if expired:
        log.info("expired %d queued requests past their deadline", len(expired))
    if not health.settled(time.monotonic()):
        return
    for model in reap:
        reaped = await queue.reap(model)
        if reaped:
            log.warning("requeued %d requests of a dead worker: %s", len(reaped), reaped)
    orphans = await queue.cancel_orphans()
    if orphans:
        log.warning("cancelled %d requests of a dead API process: %s", len(orphans), orphans)


async def sweep_forever(
    queue: Queue,
    interval: float,
    reap: tuple[str, ...] = (),
    settle_seconds: float = SETTLE_SECONDS,
) -> None:
    """Sweep every ``interval`` seconds until cancelled."""
    health = Health(settle_seconds)
    while True:
        try:
            await sweep_once(queue, reap, health)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            health.failed()
            log.warning("sweep failed: %s", exc)
        await asyncio.sleep(interval)
