"""A stock arq worker with default settings: the pickup-latency reference.

``python -m bench.stock_arq REDIS_URL`` runs ``arq.worker.Worker`` exactly as a
project adopting arq would (default ``poll_delay`` 0.5 s, default queue, signal
handling on), with one trivial job that records how long it waited: the job
gets the enqueuer's ``time.time()`` as its argument and pushes
``start - enqueued`` (seconds) onto a list. Nothing else is measured, so the
figure is the queue hop alone.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from arq.connections import RedisSettings
from arq.worker import Worker

#: The function name that the benchmark enqueues.
JOB = "push_wait"


async def push_wait(ctx: dict[str, Any], key: str, enqueued_at: float) -> None:
    started = time.time()
    await ctx["redis"].rpush(key, repr(started - enqueued_at))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m bench.stock_arq REDIS_URL", file=sys.stderr)
        return 2
    asyncio.set_event_loop(asyncio.new_event_loop())
    worker = Worker(functions=[push_wait], redis_settings=RedisSettings.from_dsn(argv[0]))
    worker.run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
