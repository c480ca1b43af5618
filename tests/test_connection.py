"""A pool's check of the connection it hands out: no read, and still no stale reply."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

import pytest
from redis.asyncio import Redis

from llmq.connection import PooledReplyParser, connect
from llmq.embedded import EmbeddedRedis
from llmq.settings import CommonSettings
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(30)


def _client(server: EmbeddedRedis) -> Redis:
    """llmq's client, with one connection, so that every command reuses it."""
    return connect(CommonSettings(redis_url=server.url), max_connections=1)


def _without_suspending(check: Coroutine[Any, Any, bool]) -> bool:
    """What ``check`` returns, run without an event loop turn; fails if it waits."""
    try:
        check.send(None)
    except StopIteration as done:
        return bool(done.value)
    check.close()
    raise AssertionError("the check waited on the event loop (it read the socket)")


async def test_pools_check_their_connections_with_the_reading_free_parser(
    redis_server: EmbeddedRedis,
) -> None:
    client = _client(redis_server)
    try:
        assert client.connection_pool.connection_kwargs["parser_class"] is PooledReplyParser
        connection = await client.connection_pool.get_connection()
        try:
            assert _without_suspending(connection.can_read_destructive()) is False
        finally:
            await client.connection_pool.release(connection)
        await client.set("k", "v")
        assert await client.get("k") == "v"
    finally:
        await client.aclose(close_connection_pool=True)


async def test_a_connection_returned_with_an_unread_reply_is_not_handed_out_as_is(
    redis_server: EmbeddedRedis,
) -> None:
    """A reply left unread (a command whose caller went away before reading it) would
    answer the next command on that connection: the pool must reconnect it instead."""
    client = _client(redis_server)
    pool = client.connection_pool
    try:
        await client.set("k", "v")
        dirty = await pool.get_connection()
        await dirty.send_command("ECHO", "stale")  # its reply is never read
        # the event loop takes the reply off the socket into the connection's stream
        await wait_until(lambda: bool(dirty._reader._buffer), timeout=10, what="the reply")
        assert _without_suspending(dirty.can_read_destructive()) is True
        await pool.release(dirty)
        assert await client.get("k") == "v"  # not "stale"
    finally:
        await client.aclose(close_connection_pool=True)


async def test_a_connection_the_server_closed_is_seen_as_closed(
    redis_server: EmbeddedRedis,
) -> None:
    client = _client(redis_server)
    pool = client.connection_pool
    try:
        closed = await pool.get_connection()
        try:
            await closed.send_command("CLIENT", "KILL", "SKIPME", "no", "TYPE", "normal")
            assert await closed.read_response() == 1  # itself, after it answers
            await wait_until(lambda: closed._reader.at_eof(), timeout=10, what="the close")
            assert _without_suspending(closed.can_read_destructive()) is True
        finally:
            await closed.disconnect()
            await pool.release(closed)
        assert await client.ping()
    finally:
        await client.aclose(close_connection_pool=True)
