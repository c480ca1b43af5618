"""Every Redis client llmq makes packs its commands with hiredis's C packer, into the
bytes redis-py's own packer makes, on a single Redis and on a Cluster."""

from __future__ import annotations

from typing import Any

import hiredis
import pytest
from redis.asyncio.connection import Connection
from redis.exceptions import DataError

from llmq.connection import connect, hiredis_packing
from llmq.settings import ApiSettings
from tests.support.cluster import BOTH_BACKENDS

pytestmark = pytest.mark.timeout(60)

CASES: list[tuple[Any, ...]] = [
    ("SET", "k", "v"),
    ("SET", "k", 1.5),
    ("SET", "k", 1 / 3),
    ("SET", "k", 10**20),
    ("SET", "k", -7),
    ("SET", "k", b"\x00\xff"),
    ("SET", "k", "é✓ 漢"),
    ("SET", "k", "x" * 100_000),  # over redis-py's buffer cutoff
    ("CONFIG GET", "maxmemory"),  # a command name of two words
    (b"CONFIG GET", b"maxmemory"),
    ("SET", "k", memoryview(b"abc")),  # hiredis refuses it: redis-py packs it
    ("EVALSHA", "f" * 40, 2, "{m}:a", "{m}:b", 3, 0.25, "", b""),
]


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """The argument tuples hiredis packs from now on."""
    packed: list[tuple[Any, ...]] = []
    real = hiredis.pack_command

    def pack(args: tuple[Any, ...]) -> bytes:
        packed.append(args)
        out: bytes = real(args)
        return out

    monkeypatch.setattr(hiredis, "pack_command", pack)
    return packed


def test_the_bytes_are_redis_pys_and_so_are_the_refusals() -> None:
    plain, packing = Connection(), hiredis_packing(Connection)()
    for args in CASES:
        assert b"".join(packing.pack_command(*args)) == b"".join(plain.pack_command(*args)), args
    refused: list[tuple[Any, type[Exception]]] = [
        (True, DataError),
        (None, DataError),
        ("\ud800", UnicodeEncodeError),
    ]
    for bad, error in refused:
        with pytest.raises(error):
            plain.pack_command("SET", "k", bad)
        with pytest.raises(error):
            packing.pack_command("SET", "k", bad)


def test_another_encoding_is_packed_by_redis_py(monkeypatch: pytest.MonkeyPatch) -> None:
    packed = _spy(monkeypatch)
    latin = hiredis_packing(Connection)(encoding="latin-1")
    assert (
        b"".join(latin.pack_command("SET", "k", "é"))
        == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\n\xe9\r\n"
    )
    assert packed == []


@BOTH_BACKENDS
async def test_every_client_packs_with_hiredis_and_its_commands_run(
    backend: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    packed = _spy(monkeypatch)
    client = connect(ApiSettings(redis_url=redis_url))
    try:
        await client.set("{packing}:s", "é✓")
        pipe = client.pipeline(transaction=False)
        pipe.incrbyfloat("{packing}:f", 0.25)
        pipe.get("{packing}:s")
        assert await pipe.execute() == [0.25, "é✓"]
        script = client.register_script("return {KEYS[1], ARGV[1], ARGV[2]}")
        assert await script(keys=["{packing}:k"], args=[7, 1.5]) == ["{packing}:k", "7", "1.5"]
    finally:
        await client.aclose(close_connection_pool=True)
    sent = {args[0] for args in packed}
    assert {"SET", "INCRBYFLOAT", "GET", "EVALSHA"} <= sent, sent
