"""A Redis Cluster primary fails over under a stream: llmq follows the slot.

The primary that holds the model's queue is SIGKILLed while a request streams.
Its replica takes over within a couple of seconds (``cluster-node-timeout`` 1 s);
the API and the worker rediscover the cluster, the worker's pub/sub and arq pool
move to the new owner of the model's slot (``llmq.connection.SlotPool``), and the
stream finishes whole: every token once, in order. The next request runs too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any, cast

import pytest
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.connection import Connection
from redis.exceptions import ConnectionError as RedisConnectionError

from llmq.connection import connect_cluster, owner, torn_connections
from llmq.protocol import keys
from llmq.settings import CommonSettings
from rigs.embedded_cluster import EmbeddedCluster
from tests.support.native import post_request, wait_ready, wait_status
from tests.support.runs import undisturbed
from tests.support.servers import StartApi, StartWorker
from tests.support.sse import frames

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def own_cluster() -> Iterator[EmbeddedCluster]:
    """A cluster of this test's own, which it damages."""
    with EmbeddedCluster(primaries=3, replicas=1) as cluster:
        yield cluster


@pytest.fixture
async def redis(own_cluster: EmbeddedCluster) -> AsyncIterator[Redis]:
    client = RedisCluster(host="127.0.0.1", port=own_cluster.nodes[0].port, decode_responses=True)
    yield cast(Redis, client)
    await client.aclose()


@pytest.fixture
def redis_url(own_cluster: EmbeddedCluster, redis: Redis) -> str:
    """The URL names the very node that the test kills: llmq must find the cluster
    again from the nodes it discovered, not only from the one it was given."""
    return f"redis+cluster://127.0.0.1:{own_cluster.owner_of(keys.queue('mock')).port}/0"


@pytest.mark.slow
async def test_a_primary_failover_under_a_stream(
    own_cluster: EmbeddedCluster, start_api: StartApi, start_worker: StartWorker
) -> None:
    await start_worker(model_tokens_per_second=40, lease_seconds=3)
    api = await start_api()
    max_tokens, seed = 120, 3
    body = {"model": "mock", "prompt": "fail over", "max_tokens": max_tokens, "seed": seed}
    text, killed = "", False
    async with api.client() as client:
        await wait_ready(client)
        async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            async for frame in frames(r):
                if frame.data == "[DONE]":
                    break
                chunk = frame.json()
                assert "error" not in chunk, chunk
                text += "".join(c.get("text") or "" for c in chunk["choices"])
                if not killed and len(text.split()) >= 20:
                    own_cluster.owner_of(keys.queue("mock")).kill()
                    killed = True
        after = await post_request(client, "after", max_tokens=5)
        done = await wait_status(client, after, "done", timeout=30)
    assert killed
    assert text == "".join(await undisturbed(max_tokens, seed)), "tokens lost or repeated"
    assert done["completion_tokens"] == 5


async def test_a_connection_closed_under_a_command_is_an_outage_not_a_bug() -> None:
    """redis-py's cluster client can send on a connection its own topology refresh
    just closed; the command then dies inside redis-py with ``AttributeError``
    (redis/redis-py#3546, #3835). That must reach llmq's retry loops as a lost
    connection, while the same error raised by llmq's own code stays a bug."""
    closed = Connection()  # redis-py's own connection, its socket not open
    with pytest.raises(RedisConnectionError, match="closed under a command"):
        with torn_connections():
            await closed._send_packed_command([b"*1\r\n$4\r\nPING\r\n"])
    with pytest.raises(AttributeError):
        with torn_connections():
            cast(Any, None).writelines([])


async def test_a_client_closes_the_nodes_a_refresh_replaced(
    redis_cluster: EmbeddedCluster,
) -> None:
    """A refresh of the node table replaces every node; a command that still held a
    connection of a replaced node reopens it. Closing the client closes it too."""
    client = connect_cluster(CommonSettings(redis_url=redis_cluster.url))
    await client.initialize()
    await client.ping()
    replaced = owner(client, keys.queue("mock"))
    held = replaced.acquire_connection()  # a command's connection, as a refresh runs
    await client.nodes_manager.initialize()
    assert owner(client, keys.queue("mock")) is not replaced
    await replaced.disconnect()  # what the refresh scheduled for the replaced node
    await held.connect()  # type: ignore[no-untyped-call]  # the command goes on there
    await client.aclose()
    assert not held.is_connected
