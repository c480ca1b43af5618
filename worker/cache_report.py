"""What this worker's KV cache holds, published for the queue's routing.

A backend that reports its cache (:class:`llmq.model.interface.CacheReporting`)
calls :meth:`CacheReport.heard` with the block names it stored and evicted; the
worker keeps the set they add up to and, at every heartbeat, sends only what
changed since the last one (``llmq/protocol/lua/route_beat.lua``), with its load and
pace (``worker/pace.py``).
So the cost in Redis is one set member per 16-token block that changed, batched per
heartbeat, and bounded by the size of the backend's cache. If the published set is
gone (its TTL ran out during an outage, or Redis lost it) or a beat failed, the
next beat sends the whole set again, as every :data:`RESYNC_SECONDS`: a routed
claim adds the prompt's blocks to the claimer's set before its engine computes them
(``lua/affinity.lua``), and a block the engine never cached (the request was
cancelled or preempted) leaves the set then. A backend that reports nothing
publishes an empty cache: routing then only balances load and follows sessions for it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from llmq.model.interface import CacheReporting
from llmq.protocol.queue import Queue
from llmq.protocol.routing import UNMEASURED, Pace

log = logging.getLogger(__name__)

#: How often the whole cache is sent, replacing the published set.
RESYNC_SECONDS = 30.0


class CacheReport:
    """The blocks the backend's cache holds, and what changed since the last beat."""

    def __init__(self, backend: object) -> None:
        self.held: set[str] = set()
        self._stored: set[str] = set()
        self._evicted: set[str] = set()
        self._full = True
        self._synced = time.monotonic()
        if isinstance(backend, CacheReporting):
            backend.watch_cache(self.heard)

    def heard(self, stored: Sequence[str], evicted: Sequence[str]) -> None:
        """The backend's listener: blocks that became cached, then those evicted."""
        for name in stored:
            self.held.add(name)
            self._evicted.discard(name)
            self._stored.add(name)
        for name in evicted:
            self.held.discard(name)
            self._stored.discard(name)
            self._evicted.add(name)

    async def publish(
        self,
        queue: Queue,
        model: str,
        worker_id: str,
        *,
        running: int,
        capacity: int,
        ttl_ms: int,
        pace: Pace = UNMEASURED,
    ) -> None:
        """One routing beat: the changes (or the whole cache), the load and the pace."""
        if time.monotonic() - self._synced >= RESYNC_SECONDS:
            self._full = True
        for _ in range(2):
            full = self._full
            stored = list(self.held) if full else list(self._stored)
            evicted = [] if full else list(self._evicted)
            self._stored.clear()
            self._evicted.clear()
            self._full = False
            try:
                applied = await queue.route_beat(
                    model,
                    worker_id,
                    running=running,
                    capacity=capacity,
                    ttl_ms=ttl_ms,
                    stored=stored,
                    evicted=evicted,
                    cache_size=len(self.held) - len(stored),
                    full=full,
                    pace=pace,
                )
            except BaseException:
                self._full = True  # whatever landed, the next beat sends it all
                raise
            if applied:
                if full:
                    self._synced = time.monotonic()
                return
            self._full = True  # the published set was gone: send the whole cache now
