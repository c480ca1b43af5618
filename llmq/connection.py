"""Redis clients, built the same way in every process.

Pools are bounded (``redis_max_connections``) and block for at most
``redis_pool_timeout_seconds`` when exhausted, so an overload surfaces as an error
rather than an unbounded pile of sockets. Transient connection errors are retried
with exponential backoff; blocking readers get their own client whose socket
timeout exceeds their block time.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from llmq.settings import CommonSettings


def _retry() -> Retry:
    return Retry(
        ExponentialBackoff(cap=0.5, base=0.02),
        retries=3,
        supported_errors=(RedisConnectionError, RedisTimeoutError),
    )


def pool_kwargs(settings: CommonSettings, *, max_connections: int | None = None) -> dict[str, Any]:
    """Keyword arguments for a :class:`BlockingConnectionPool` from the settings."""
    return {
        "max_connections": max_connections or settings.redis_max_connections,
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
) -> BlockingConnectionPool:
    kwargs = pool_kwargs(settings, max_connections=max_connections)
    if socket_timeout is not None:
        kwargs["socket_timeout"] = socket_timeout
    pool: BlockingConnectionPool = BlockingConnectionPool.from_url(
        settings.redis_url, decode_responses=decode_responses, **kwargs
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
