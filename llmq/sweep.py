"""The deadline sweep that every API and worker process runs.

Requests that wait in a queue past their deadline are removed and ended with a
``queue_timeout`` error, whether or not any worker is alive to notice. The sweep
is one atomic script, so many processes running it never double-handle a request.
"""

from __future__ import annotations

import asyncio
import logging

from llmq.queue import Queue

log = logging.getLogger(__name__)


async def sweep_forever(queue: Queue, interval: float, reap: tuple[str, ...] = ()) -> None:
    """Expire overdue queued requests; also requeue the ``reap`` models' requests
    whose worker lease ran out (a worker that died without handing them back)."""
    while True:
        try:
            expired = await queue.sweep()
            if expired:
                log.info("expired %d queued requests past their deadline", len(expired))
            for model in reap:
                reaped = await queue.reap(model)
                if reaped:
                    log.warning("requeued %d requests of a dead worker: %s", len(reaped), reaped)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("deadline sweep failed: %s", exc)
        await asyncio.sleep(interval)
