"""The stream relay on a Redis Cluster: one :class:`~api.streams.relay.StreamRelay` per slot.

A Redis Cluster refuses an ``XREAD`` whose streams are in different slots, even on
one node, so the single reader of a plain Redis becomes one reader per request
group (:data:`llmq.protocol.keys.REQUEST_GROUPS`): each reads the streams of its group, with
a control stream of its own in the same slot, on a plain connection to the node
that owns that slot (:class:`llmq.connection.SlotPool`, which follows the slot to
a new owner after a failover). A group's reader starts with its first subscriber.
Subscribers see the same :class:`~api.streams.subscription.Subscription` as on a plain Redis.
"""

from __future__ import annotations

import asyncio
import contextlib

from redis.asyncio import Redis, RedisCluster

from api.streams.relay import StreamRelay, Subscribing
from api.streams.subscription import Subscription
from llmq.connection import slot_pool
from llmq.protocol import keys
from llmq.settings import ApiSettings


class GroupedRelay(Subscribing):
    """Relays streams through one :class:`StreamRelay` per request group."""

    def __init__(self, settings: ApiSettings, cluster: RedisCluster, process_id: str) -> None:
        self._settings = settings
        self._cluster = cluster
        self._process_id = process_id
        self._relays: dict[int, StreamRelay] = {}
        self._clients: list[Redis] = []
        self._starting = asyncio.Lock()

    @property
    def subscribers(self) -> int:
        return sum(r.subscribers for r in self._relays.values())

    async def start(self) -> None:
        """Nothing to start before a subscriber comes: each group's reader starts then."""

    async def stop(self) -> None:
        for relay in self._relays.values():
            await relay.stop()
        for client in self._clients:
            with contextlib.suppress(Exception):
                await client.aclose(close_connection_pool=True)
        self._relays.clear()
        self._clients.clear()

    async def _relay(self, group: int) -> StreamRelay:
        found = self._relays.get(group)
        if found is not None:
            return found
        async with self._starting:
            found = self._relays.get(group)
            if found is not None:
                return found
            control = keys.control(self._process_id, group)
            block_ms = self._settings.relay_block_ms
            pool = await slot_pool(
                self._settings,
                self._cluster,
                control,
                max_connections=2,
                socket_timeout=block_ms / 1000 + 5,
            )
            client = Redis(connection_pool=pool)
            self._clients.append(client)
            relay = StreamRelay(client, control, block_ms=block_ms)
            await relay.start()
            self._relays[group] = relay
            return relay

    async def subscribe(self, key: str, last_id: str = "0-0") -> Subscription:
        relay = await self._relay(keys.group_of(key))
        return await relay.subscribe(key, last_id)

    def unsubscribe(self, sub: Subscription) -> None:
        relay = self._relays.get(keys.group_of(sub.key))
        if relay is not None:
            relay.unsubscribe(sub)
