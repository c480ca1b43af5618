"""Riding out a Redis outage: the one retry schedule and the one way a loop says so.

Every loop that talks to Redis for as long as its process lives (the relay's
reader, the publisher's flusher, the claim loop, the wake-up listener, the
periodic tasks of :mod:`llmq.tasks`) waits an outage out instead of dying of it,
and logs it once when it starts and once when it ends, not on every retry.
:data:`OUTAGE` is what such a loop waits out, :func:`backoff` how long it waits
between attempts (the pooled clients of :mod:`llmq.connection` retry on the same
schedule), :class:`Outage` the counting and the two log lines.
"""

from __future__ import annotations

import asyncio
import logging

from redis.backoff import ExponentialBackoff
from redis.exceptions import ClusterError, MovedError, RedisClusterException, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

#: What a loop that talks to Redis waits out rather than dies of: Redis (or the
#: node owning a slot) is away, or a Redis Cluster is moving a slot or failing over.
OUTAGE = (
    RedisConnectionError,
    RedisTimeoutError,
    OSError,
    RedisClusterException,
    ClusterError,
    MovedError,
    TryAgainError,
)


def backoff() -> ExponentialBackoff:
    """How long to wait before retrying after a connection error, by failures so far.

    One schedule for every retry in llmq (pooled commands, the relay's reader): 40 ms
    after the first failure, doubling to at most 0.5 s, so a Redis that comes back is
    used again within half a second and one that stays away costs two attempts a
    second, not a busy loop.
    """
    return ExponentialBackoff(cap=0.5, base=0.02)


class Outage:
    """A loop that talks to Redis, through an outage: one warning when it starts, one
    line when it ends, and a backoff between attempts: the shared :func:`backoff`,
    unless ``schedule`` gives the loop its own.

    ``lost`` is a log format taking the error, ``back`` one taking the number of
    failed attempts. A loop that keeps its own pace (:func:`llmq.tasks.run_periodically`)
    uses only the log lines: :meth:`note` and :meth:`recovered`.
    """

    def __init__(
        self,
        log: logging.Logger,
        *,
        lost: str,
        back: str,
        schedule: ExponentialBackoff | None = None,
    ) -> None:
        self.log = log
        self.lost = lost
        self.back = back
        self.failures = 0  # consecutive failed attempts: >0 while Redis is unreachable
        self._backoff = schedule or backoff()

    def note(self, exc: BaseException) -> float:
        """Count a failed attempt (warn if it is the first); the seconds to wait
        before the next one."""
        if not self.failures:
            self.log.warning(self.lost, exc)
        self.failures += 1
        return float(self._backoff.compute(self.failures))

    async def failed(self, exc: BaseException) -> None:
        """Count a failed attempt (warn if it is the first) and wait before the next."""
        await asyncio.sleep(self.note(exc))

    def recovered(self) -> None:
        """An attempt worked: say so once if an outage just ended."""
        if self.failures:
            self.log.info(self.back, self.failures)
            self.failures = 0
