"""An exhausted Redis pool is overload (429 ``server_busy``), not an outage; pools are sized
from the process's concurrency; a pool checks the connection it hands out without a
read, and still hands out none with a stale reply or closed by the server."""

from __future__ import annotations

import time
from collections.abc import Coroutine
from typing import Any

import pytest
from redis.asyncio import Redis

from llmq.connection import (
    DEFAULT_POOL_SIZE,
    WORKER_POOL_HEADROOM,
    PooledReplyParser,
    connect,
    pool_size,
)
from llmq.embedded import EmbeddedRedis
from llmq.protocol import keys
from llmq.settings import ApiSettings, CommonSettings, WorkerSettings
from tests.support.native import wait_ready
from tests.support.servers import StartApi, StartWorker
from tests.support.waiting import wait_until

POOL_TIMEOUT = 0.3


async def test_exhausted_pool_answers_429_not_503(
    start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    await start_worker()
    api = await start_api(redis_max_connections=1, redis_pool_timeout_seconds=POOL_TIMEOUT)
    body = {"model": "mock", "prompt": "x", "max_tokens": 2}
    async with api.client() as client:
        await wait_ready(client)
        pool = api.app_state().redis.connection_pool
        held = await pool.get_connection()  # the pool's only connection: it is exhausted
        try:
            before = await redis.dbsize()
            started = time.monotonic()
            busy = await client.post("/v1/completions", json=body)
            took = time.monotonic() - started
            after_refusal = await redis.dbsize()
        finally:
            await pool.release(held)
        served = await client.post("/v1/completions", json=body)
    assert busy.status_code == 429, busy.text
    assert busy.headers["retry-after"] == "1"
    assert busy.json()["error"]["code"] == "server_busy"
    assert busy.json()["error"]["type"] == "rate_limit_error"
    # It waited for a connection for the bound, then answered (the upper bound is only a
    # loaded machine's margin: the answer comes after the wait, not never).
    assert POOL_TIMEOUT * 0.9 <= took < POOL_TIMEOUT + 10.0
    # The refusal left nothing behind, and the process serves again once a connection frees.
    assert after_refusal == before and await redis.zcard(keys.queue("mock")) == 0
    assert served.status_code == 200 and served.json()["usage"]["completion_tokens"] == 2


def test_pool_sizes_follow_the_configured_concurrency() -> None:
    assert pool_size(ApiSettings()) == DEFAULT_POOL_SIZE
    assert pool_size(WorkerSettings(concurrency=8)) == DEFAULT_POOL_SIZE
    assert pool_size(WorkerSettings(concurrency=400)) == 400 + WORKER_POOL_HEADROOM
    assert pool_size(WorkerSettings(concurrency=400, redis_max_connections=5)) == 5
    with pytest.raises(ValueError):
        ApiSettings(redis_max_connections=-1)


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
