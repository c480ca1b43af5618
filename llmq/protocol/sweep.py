"""The sweep that every API and worker process runs.

Each pass, one atomic script per job, so many processes running it never
double-handle a request:

- queued requests past their deadline are removed and ended with a
  ``queue_timeout`` error, whether or not any worker is alive to notice;
- running requests of the ``reap`` models whose worker stopped renewing their
  lease go back to the queue, and the attempt that held the lease is fenced off;
- requests attached to an API process that stopped renewing its lease (its
  OpenAI clients' connections died with it) are cancelled.

The last two judge leases in lease time, a clock kept in Redis that a stall,
restart or outage of Redis advances by at most 300 ms (``llmq/protocol/lua/clock.lua``). So
an outage is never mistaken for the death of everyone, and the sweep needs no
wait of its own after one: when Redis is back, every live process has its lease
(minus those 300 ms) to renew. The sweep's own calls keep that clock moving.
"""

from __future__ import annotations

import logging
from typing import NoReturn

from llmq.protocol.queue import Queue
from llmq.tasks import run_periodically

log = logging.getLogger(__name__)


async def sweep_once(queue: Queue, reap: tuple[str, ...]) -> None:
    expired = await queue.sweep()
    if expired:
        log.info("expired %d queued requests past their deadline", len(expired))
    for model in reap:
        reaped = await queue.reap(model)
        if reaped:
            log.warning("requeued %d requests of a dead worker: %s", len(reaped), reaped)
    orphans = await queue.cancel_orphans()
    if orphans:
        log.warning("cancelled %d requests of a dead API process: %s", len(orphans), orphans)


async def sweep_forever(queue: Queue, interval: float, reap: tuple[str, ...] = ()) -> NoReturn:
    """Sweep every ``interval`` seconds until cancelled; an outage is logged once."""
    await run_periodically(lambda: sweep_once(queue, reap), interval, what="sweep", logger=log)
