"""Redis clients, built the same way in every process.

Pools are bounded (``redis_max_connections``, or sized from the process's
concurrency, see :func:`pool_size`) and block for at most
``redis_pool_timeout_seconds`` when exhausted, so an overload surfaces as an error
rather than an unbounded pile of sockets. That error is :class:`PoolExhausted`, not
a bare connection error: the process is busy, Redis is fine, and callers answer it
as overload (429), never as an outage. Transient connection errors are retried
with exponential backoff; blocking readers get their own client whose socket
timeout exceeds their block time.

With ``LLMQ_REDIS_SENTINELS`` set, every pool asks the Sentinels for the primary
when it opens a connection, so after a failover the next connection (every
connection error drops the broken one) goes to the new primary, and a connection
still open to a demoted primary is dropped on its first refused write.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.connection import SSLConnection, parse_url
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from llmq.settings import CommonSettings, WorkerSettings

#: Connections a pool holds when ``redis_max_connections`` is 0 (auto), at least.
#: API commands are short (enqueue, cancel, status); the relay's blocking reads have
#: a pool of their own, so an API's pool bounds commands in flight, not streams.
DEFAULT_POOL_SIZE = 64
#: Connections a worker needs beside one per running request: claim, heartbeat,
#: sweep, pub/sub listeners, cancels.
WORKER_POOL_HEADROOM = 16


class PoolExhausted(RedisConnectionError):
    """No pooled connection came free within ``redis_pool_timeout_seconds``: overload.

    A subclass of redis-py's ``ConnectionError`` (which its pool raises), so code
    that treats any connection error alike still does; the API's error boundary
    tells it apart from an outage.
    """


class BoundedPool(BlockingConnectionPool):
    """redis-py's blocking pool, raising :class:`PoolExhausted` when it times out."""

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().get_connection(*args, **kwargs)
        except RedisConnectionError as exc:
            if isinstance(exc.__cause__, asyncio.TimeoutError) and not isinstance(
                exc, PoolExhausted
            ):
                raise PoolExhausted(
                    f"all {self.max_connections} pooled Redis connections busy for {self.timeout}s"
                ) from exc
            raise


def pool_size(settings: CommonSettings) -> int:
    """``redis_max_connections``, or with 0 (auto) what the process's concurrency needs.

    A worker may have every running request flushing at once, so it gets one
    connection per slot plus :data:`WORKER_POOL_HEADROOM` (at least
    :data:`DEFAULT_POOL_SIZE`); an API process gets :data:`DEFAULT_POOL_SIZE`.
    """
    if settings.redis_max_connections > 0:
        return settings.redis_max_connections
    if isinstance(settings, WorkerSettings):
        return max(DEFAULT_POOL_SIZE, settings.concurrency + WORKER_POOL_HEADROOM)
    return DEFAULT_POOL_SIZE


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
    line when it ends, and the shared :func:`backoff` between attempts.

    ``lost`` is a log format taking the error, ``back`` one taking the number of
    failed attempts.
    """

    def __init__(self, log: logging.Logger, *, lost: str, back: str) -> None:
        self.log = log
        self.lost = lost
        self.back = back
        self.failures = 0  # consecutive failed attempts: >0 while Redis is unreachable
        self._backoff = backoff()

    async def failed(self, exc: BaseException) -> None:
        """Count a failed attempt (warn if it is the first) and wait before the next."""
        if not self.failures:
            self.log.warning(self.lost, exc)
        self.failures += 1
        await asyncio.sleep(self._backoff.compute(self.failures))

    def recovered(self) -> None:
        """An attempt worked: say so once if an outage just ended."""
        if self.failures:
            self.log.info(self.back, self.failures)
            self.failures = 0


def _retry() -> Retry:
    return Retry(
        backoff(),
        retries=3,
        supported_errors=(RedisConnectionError, RedisTimeoutError),
    )


def pool_kwargs(settings: CommonSettings, *, max_connections: int | None = None) -> dict[str, Any]:
    """Keyword arguments for a :class:`BlockingConnectionPool` from the settings."""
    return {
        "max_connections": max_connections or pool_size(settings),
        "timeout": settings.redis_pool_timeout_seconds,
        "socket_timeout": settings.redis_socket_timeout_seconds,
        "socket_connect_timeout": settings.redis_socket_timeout_seconds,
        "health_check_interval": 10,
        "retry": _retry(),
    }


def make_pool(
    settings: CommonSettings,
    *,
    decode_responses: bool = True,
    max_connections: int | None = None,
    socket_timeout: float | None = None,
) -> BoundedPool:
    kwargs = pool_kwargs(settings, max_connections=max_connections)
    if socket_timeout is not None:
        kwargs["socket_timeout"] = socket_timeout
    if settings.redis_sentinels:
        return _sentinel_pool(settings, decode_responses=decode_responses, **kwargs)
    pool: BoundedPool = BoundedPool.from_url(
        settings.redis_url, decode_responses=decode_responses, **kwargs
    )
    return pool


class SentinelBlockingPool(SentinelConnectionPool, BoundedPool):
    """redis-py's Sentinel pool, bounded and blocking like every other llmq pool.

    ``SentinelConnectionPool`` resolves the primary per connection but is a plain
    pool (raises when full); mixing in :class:`BoundedPool` makes it wait
    ``redis_pool_timeout_seconds`` for a free connection instead, and say
    :class:`PoolExhausted` when none comes free.
    """

    async def disconnect(self, inuse_connections: bool = True) -> None:
        await super().disconnect(inuse_connections)
        if inuse_connections:  # closing the pool (not just dropping idle ones after a failover)
            for sentinel in self.sentinel_manager.sentinels:
                await sentinel.connection_pool.disconnect()


def _sentinel_pool(
    settings: CommonSettings, *, decode_responses: bool, **kwargs: Any
) -> BoundedPool:
    # host and port of the URL are ignored: the Sentinels say where the primary is
    url = parse_url(settings.redis_url)
    for name in ("username", "password", "db"):
        if name in url:
            kwargs[name] = url[name]
    kwargs["ssl"] = url.get("connection_class") is SSLConnection
    sentinel_kwargs = {
        "max_connections": kwargs["max_connections"],
        "socket_timeout": kwargs["socket_connect_timeout"],
        "socket_connect_timeout": kwargs["socket_connect_timeout"],
        "decode_responses": True,
    }
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        settings.sentinel_addresses(), sentinel_kwargs=sentinel_kwargs
    )
    pool = SentinelBlockingPool(  # type: ignore[no-untyped-call]
        settings.redis_sentinel_master,
        sentinel,
        decode_responses=decode_responses,
        **kwargs,
    )
    return pool


def connect(
    settings: CommonSettings,
    *,
    max_connections: int | None = None,
    socket_timeout: float | None = None,
) -> Redis:
    """A client with ``str`` responses over a bounded, retrying pool."""
    pool = make_pool(settings, max_connections=max_connections, socket_timeout=socket_timeout)
    return Redis(connection_pool=pool)
