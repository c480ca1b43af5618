"""Connections through Sentinel (LLMQ_REDIS_SENTINELS), on loopback: found, bounded, closed."""

from __future__ import annotations

import asyncio
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from pydantic import ValidationError

from llmq.connection import PoolExhausted, SentinelBlockingPool, connect, make_pool
from llmq.embedded import EmbeddedRedis, find_redis_server, free_port
from llmq.settings import CommonSettings
from tests.support.processes import wait_for

PASSWORD = "sentinel-test"


@pytest.fixture(scope="module")
def sentinel() -> Iterator[tuple[EmbeddedRedis, int]]:
    """A password-protected primary and one Sentinel (quorum 1) watching it."""
    with EmbeddedRedis() as primary, tempfile.TemporaryDirectory() as folder:
        with redis.Redis(port=primary.port) as admin:
            admin.config_set("requirepass", PASSWORD)
        port = free_port()
        conf = Path(folder) / "sentinel.conf"
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {folder}\n"
            f"sentinel monitor llmq 127.0.0.1 {primary.port} 1\n"
            f"sentinel auth-pass llmq {PASSWORD}\n"
        )
        proc = subprocess.Popen(
            [find_redis_server(), str(conf), "--sentinel"], stdout=subprocess.DEVNULL
        )
        try:
            probe = ["redis-cli", "-p", str(port), "sentinel", "get-master-addr-by-name", "llmq"]
            wait_for(
                lambda: (
                    str(primary.port)
                    in subprocess.run(probe, capture_output=True, text=True).stdout
                ),
                10,
                "the Sentinel",
            )
            yield primary, port
        finally:
            proc.kill()
            proc.wait()


def _names(port: int) -> tuple[str, int] | None:
    """What the Sentinel on ``port`` says the primary is (None while it does not answer)."""
    try:
        with redis.Redis(port=port, decode_responses=True) as client:
            found = client.sentinel_get_master_addr_by_name("llmq")
    except redis.RedisError:
        return None
    return (str(found[0]), int(found[1])) if found else None


def settings(port: int, **overrides: object) -> CommonSettings:
    return CommonSettings(
        redis_url=f"redis://:{PASSWORD}@ignored.invalid:1/3",
        redis_sentinels=f"127.0.0.1:{port}",
        **overrides,  # type: ignore[arg-type]
    )


def test_sentinel_addresses_must_be_host_port() -> None:
    with pytest.raises(ValidationError, match="not host:port"):
        CommonSettings(redis_sentinels="127.0.0.1:26379,nohost")
    assert CommonSettings(redis_sentinels="a:1, b:2").sentinel_addresses() == [("a", 1), ("b", 2)]


async def test_commands_reach_the_primary_the_sentinel_names(
    sentinel: tuple[EmbeddedRedis, int],
) -> None:
    primary, port = sentinel
    client = connect(settings(port))
    try:
        assert isinstance(client.connection_pool, SentinelBlockingPool)
        await client.set("through-sentinel", "yes")
        # the URL's host is ignored; its password and db are used
        pool = client.connection_pool
        assert isinstance(pool, SentinelBlockingPool)
        found = await pool.get_master_address()  # type: ignore[no-untyped-call]
        assert found == ("127.0.0.1", primary.port)
        assert str((await client.client_info())["db"]) == "3"
    finally:
        await client.aclose(close_connection_pool=True)
    for s in client.connection_pool.sentinel_manager.sentinels:  # closed with the pool
        assert not s.connection_pool._in_use_connections
        assert all(c._reader is None for c in s.connection_pool._available_connections)


async def test_the_sentinel_pool_is_bounded_and_blocks(sentinel: tuple[EmbeddedRedis, int]) -> None:
    _, port = sentinel
    pool = make_pool(settings(port, redis_max_connections=2, redis_pool_timeout_seconds=0.3))
    held = [await pool.get_connection(), await pool.get_connection()]
    try:
        began = time.monotonic()
        # exhaustion is overload, told apart from an outage (429, not 503)
        with pytest.raises(PoolExhausted):
            await pool.get_connection()
        # it waited its 0.3 s, then gave up (the upper bound: a loaded machine's margin)
        assert 0.25 < time.monotonic() - began < 10
        releasing = asyncio.create_task(pool.get_connection())
        await pool.release(held.pop())
        held.append(await asyncio.wait_for(releasing, 2))
    finally:
        for connection in held:
            await pool.release(connection)
        await pool.disconnect()
