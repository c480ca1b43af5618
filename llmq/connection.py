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

With a ``redis+cluster://host:port`` URL (``rediss+cluster://`` for TLS), llmq runs
on a Redis Cluster: :func:`connect` returns redis-py's cluster client (it finds the
other nodes from the one named, routes each command and script by its keys' slot,
and follows MOVED redirections and failovers), and :class:`SlotPool` gives the
plain connections that the cluster client lacks (pub/sub, the relay's blocking
reads) to whichever node owns one slot now. Every script's keys share a slot
(:mod:`llmq.protocol.keys`), so the cluster client runs them as they are. Its pipelines
cannot be transactions: a ``transaction=True`` pipeline runs as a plain one there
(:class:`ClusterClient`), which only the few multi-key bookkeeping writes use
(unparking, unregistering).
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast
from weakref import WeakSet

from redis._parsers.hiredis import _AsyncHiredisParser
from redis.asyncio import BlockingConnectionPool, Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode, ClusterPipeline
from redis.asyncio.connection import SSLConnection, parse_url
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.utils import HIREDIS_AVAILABLE

from llmq.outage import backoff
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


def _retry() -> Retry:
    return Retry(
        backoff(),
        retries=3,
        supported_errors=(RedisConnectionError, RedisTimeoutError),
    )


class PooledReplyParser(_AsyncHiredisParser):
    """redis-py's hiredis reply parser, whose check of a connection that a pool hands
    out reads nothing.

    A pool asks of every connection it hands out whether the connection holds
    unread replies or was closed by the server. redis-py before 8.1 (arq pins it
    below 6) answers by reading the socket with a zero timeout: a cancelled read and
    a turn of the event loop before every command, a seventh to a fifth of a short
    command's CPU in the client (docs/upstream-benchmark.md). What the connection
    already holds answers the same question, and redis-py 8.1 asks it the same way:
    a reply the parser has buffered, bytes the event loop has received for it and
    not handed over, or the end of its stream.
    """

    async def can_read_destructive(self) -> bool:
        reader, stream = self._reader, self._stream
        if not self._connected or reader is None or stream is None:
            raise RedisConnectionError("the connection to Redis is closed")
        # bytes the event loop received and no read took yet (tests/test_pool.py
        # checks that asyncio's StreamReader still keeps them there)
        received: bytearray = stream._buffer
        return bool(reader.has_data() or stream.at_eof() or received)


def pool_kwargs(settings: CommonSettings, *, max_connections: int | None = None) -> dict[str, Any]:
    """Keyword arguments for a :class:`BlockingConnectionPool` from the settings."""
    kwargs: dict[str, Any] = {
        "max_connections": max_connections or pool_size(settings),
        "timeout": settings.redis_pool_timeout_seconds,
        "socket_timeout": settings.redis_socket_timeout_seconds,
        "socket_connect_timeout": settings.redis_socket_timeout_seconds,
        "health_check_interval": 10,
        "retry": _retry(),
    }
    if HIREDIS_AVAILABLE:
        kwargs["parser_class"] = PooledReplyParser
    return kwargs


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
    """A client with ``str`` responses over a bounded, retrying pool; on a Redis
    Cluster the cluster client, which answers the same commands (typed as ``Redis``
    for its callers: it is used only through the commands both share)."""
    if is_cluster(settings):
        cluster = connect_cluster(
            settings, max_connections=max_connections, socket_timeout=socket_timeout
        )
        return cast(Redis, cluster)
    pool = make_pool(settings, max_connections=max_connections, socket_timeout=socket_timeout)
    return Redis(connection_pool=pool)


#: Connections a cluster client may open per node, as a multiple of the plain pool.
CLUSTER_POOL_FACTOR = 4

#: The URL schemes that choose a Redis Cluster, mapped to the plain scheme.
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def is_cluster(settings: CommonSettings) -> bool:
    """Whether ``redis_url`` names a Redis Cluster (``redis+cluster://``)."""
    return settings.redis_url.partition("://")[0] in CLUSTER_SCHEMES


def plain_url(url: str) -> str:
    """``url`` with a cluster scheme turned into the plain one (same node, same options)."""
    scheme, sep, rest = url.partition("://")
    return CLUSTER_SCHEMES.get(scheme, scheme) + sep + rest


@contextmanager
def torn_connections() -> Iterator[None]:
    """Raise a cluster connection that a topology refresh closed under a command as
    the outage it is, a :class:`redis.exceptions.ConnectionError`.

    During a failover redis-py's asyncio cluster client can go on using a connection
    that its own node-table refresh has just closed; the command then dies inside
    redis-py or asyncio with ``AttributeError``/``TypeError`` on the closed socket
    (redis/redis-py#3546, #3835). Nothing was written on that socket, so it is retried
    like any lost connection. Only errors raised inside redis-py or asyncio are
    converted: one raised in llmq's code is a bug and stays one.
    """
    try:
        yield
    except (AttributeError, TypeError) as exc:
        where = traceback.extract_tb(exc.__traceback__)[-1].filename
        if "/redis/" not in where and "/asyncio/" not in where:
            raise
        raise RedisConnectionError(f"cluster connection closed under a command: {exc}") from exc


#: How long a replaced cluster node is kept before its sockets are closed: longer
#: than any command that held one of its connections when it was replaced can take.
RETIRED_NODE_SECONDS = 60.0


class RetiredNodes:
    """The cluster nodes a topology refresh replaced, closed once nothing can use them.

    redis-py disconnects a node that a refresh replaces (and every refresh replaces
    every node), but a command already holding one of its connections reconnects it
    and hands it back to the dropped node, which nothing closes again: its socket
    would outlive the client. So each replaced node is kept for
    :data:`RETIRED_NODE_SECONDS`, then disconnected; the client disconnects the rest
    when it closes.
    """

    def __init__(self) -> None:
        self._nodes: deque[tuple[float, ClusterNode]] = deque()
        self._closing: set[asyncio.Task[None]] = set()

    def add(self, node: ClusterNode) -> None:
        now = time.monotonic()
        self._nodes.append((now, node))
        while now - self._nodes[0][0] > RETIRED_NODE_SECONDS:
            task = asyncio.get_running_loop().create_task(self._nodes.popleft()[1].disconnect())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        nodes = [node for _, node in self._nodes]
        self._nodes.clear()
        await asyncio.gather(
            *self._closing, *(node.disconnect() for node in nodes), return_exceptions=True
        )


class ScriptPipeline(ClusterPipeline):
    """redis-py's cluster pipeline, with EVALSHA allowed back in.

    redis-py blocks EVALSHA in cluster pipelines, as it cannot know in general that
    a script keeps to its declared keys. llmq's scripts do, all in one slot, so the
    pipeline routes each call by its keys like any other command; the publisher's
    batched flushes and the fence raises after a reap rely on it.
    """

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        self.execute_command("EVALSHA", sha, numkeys, *keys_and_args)
        return self

    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> Any:
        with torn_connections():
            return await super().execute(raise_on_error, allow_redirections)


class ClusterClient(RedisCluster):
    """redis-py's asyncio cluster client, taking ``transaction=True`` pipelines as
    plain ones (the cluster client refuses transactions outright; see the module
    docstring for the writes that ask for one) and running scripts in pipelines
    (:class:`ScriptPipeline`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        manager = self.nodes_manager
        self._retired = RetiredNodes()
        manager.startup_nodes = _StartupNodes(self._retired, manager.startup_nodes)
        manager.nodes_cache = _RetiringNodes(self._retired, manager.nodes_cache)

    async def initialize(self) -> ClusterClient:
        """Discover the cluster, then keep every node found as a node to start from:
        after a failover the cluster is found from any survivor, not only the URL's
        node."""
        await super().initialize()
        for node in list(self.nodes_manager.nodes_cache.values()):
            self.nodes_manager.startup_nodes.setdefault(node.name, node)
        return self

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        with torn_connections():
            return await super().execute_command(*args, **kwargs)

    def pipeline(
        self, transaction: Any | None = None, shard_hint: Any | None = None
    ) -> ClusterPipeline:
        return ScriptPipeline(self)  # type: ignore[abstract]

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        """Close every node's connections (``close_connection_pool`` is the plain
        client's argument, accepted so that callers need not tell them apart),
        those of the nodes a topology refresh replaced included."""
        await super().aclose()
        await self._retired.close()


class _RetiringNodes(dict[str, ClusterNode]):
    """A node table that hands the nodes it drops or replaces to :class:`RetiredNodes`."""

    def __init__(self, retired: RetiredNodes, nodes: dict[str, ClusterNode]) -> None:
        super().__init__(nodes)
        self.retired = retired

    def __setitem__(self, key: str, node: ClusterNode) -> None:
        old = self.get(key)
        if old is not None and old is not node:
            self.retired.add(old)
        super().__setitem__(key, node)

    def pop(self, key: str, default: Any = None) -> Any:
        node = super().pop(key, default)
        if node is not None:
            self.retired.add(node)
        return node


class _StartupNodes(_RetiringNodes):
    """The nodes a cluster client rediscovers the cluster from, which a timeout does
    not shrink. redis-py drops a node from them on any connection error or timeout
    of a command it served; on a busy host (or a one-shard cluster) a single slow
    reply then left none, and the client could never connect again."""

    def pop(self, key: str, default: Any = None) -> Any:
        return self.get(key, default)


def connect_cluster(
    settings: CommonSettings,
    *,
    decode_responses: bool = True,
    max_connections: int | None = None,
    socket_timeout: float | None = None,
) -> ClusterClient:
    """A cluster client for a ``redis+cluster://`` URL.

    redis-py's cluster client does not wait for a free connection: a node whose
    connections are all busy fails the command at once (``MaxConnectionsError``,
    not retried). So each node may open :data:`CLUSTER_POOL_FACTOR` times the
    plain pool's connections (opened only as needed), which a burst of requests
    to one shard does not exhaust.
    """
    kwargs = pool_kwargs(settings, max_connections=max_connections)
    client = ClusterClient.from_url(
        plain_url(settings.redis_url),
        decode_responses=decode_responses,
        max_connections=kwargs["max_connections"] * CLUSTER_POOL_FACTOR,
        socket_timeout=socket_timeout or kwargs["socket_timeout"],
        socket_connect_timeout=kwargs["socket_connect_timeout"],
        retry=kwargs["retry"],
    )
    return cast(ClusterClient, client)


class SlotPool(BoundedPool):
    """A bounded pool of plain connections to the node that owns ``key``'s slot.

    Each connection it hands out is pointed at the slot's owner as the cluster
    client last saw it. A connection that was dropped (after an error: a failover,
    a MOVED reply) makes the pool ask the cluster for its slots again first, so the
    next one goes to the new owner. Used for what the cluster client cannot do:
    pub/sub on the node whose scripts publish (the hand-off counts receivers there)
    and the relay's blocking reads.
    """

    def __init__(self, cluster: RedisCluster, key: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cluster = cluster
        self.key = key
        self._pointed: WeakSet[Any] = WeakSet()

    async def ensure_connection(self, connection: Any) -> None:
        if not connection.is_connected:  # new, or dropped after an error
            if connection in self._pointed:  # a reconnect: the slot may have moved
                await self.cluster.nodes_manager.initialize()
            node = owner(self.cluster, self.key)
            connection.host, connection.port = node.host, node.port
            self._pointed.add(connection)
        await super().ensure_connection(connection)


def owner(cluster: RedisCluster, key: str) -> ClusterNode:
    """The node that serves ``key``'s slot, as the cluster client last saw it."""
    node = cluster.get_node_from_key(key)
    if node is None:
        raise RedisConnectionError(f"no node serves the slot of {key!r}")
    return node


async def slot_pool(
    settings: CommonSettings,
    cluster: RedisCluster,
    key: str,
    *,
    decode_responses: bool = True,
    max_connections: int | None = None,
    socket_timeout: float | None = None,
) -> SlotPool:
    """A :class:`SlotPool` for ``key``, with the settings' timeouts and credentials."""
    await cluster.initialize()
    kwargs = pool_kwargs(settings, max_connections=max_connections)
    if socket_timeout is not None:
        kwargs["socket_timeout"] = socket_timeout
    url = parse_url(plain_url(settings.redis_url))
    url.pop("db", None)  # a cluster has database 0 only
    return SlotPool(cluster, key, **{**url, **kwargs, "decode_responses": decode_responses})
