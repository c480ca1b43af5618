"""A TCP proxy in front of an HTTP server that notes which connection carried which
request: what a test reads to see whether a client reused a connection or opened one.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field

#: An HTTP/1.1 request line: a request starts a chunk the client sends (it waits for
#: each answer before it sends the next request on a connection).
REQUEST_LINE = re.compile(rb"(?:^|\r\n)([A-Z]+) (/\S*) HTTP/1\.[01]\r\n")
#: An answer's status line, likewise at the start of a chunk the server sends.
STATUS_LINE = re.compile(rb"(?:^|\r\n)HTTP/1\.[01] \d{3} ")


@dataclass
class Connection:
    #: The requests sent on it so far, as ``"METHOD /path"``.
    requests: list[str] = field(default_factory=list)
    #: How many answers the server sent back on it so far.
    answers: int = 0


class RecordingProxy:
    """Forwards connections to ``127.0.0.1:target``; :attr:`connections` holds every
    connection accepted, in order, with its requests and answers so far."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.connections: list[Connection] = []
        self._server: asyncio.Server | None = None
        self._closed = False
        #: Every connection's handler, its pumps, and both ends of it: :meth:`close`
        #: ends them all, also those of a connection accepted while it closes (a
        #: stream's end makes the worker open one ahead at any moment).
        self._handlers: set[asyncio.Task[None]] = set()
        self._pumps: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> str:
        """Listen on a free port; the proxy's URL."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def close(self) -> None:
        """Stop listening, cut every connection, and wait for their handlers to end
        (not cancelled: asyncio logs a cancelled connection handler as an error)."""
        self._closed = True
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.close()
        for pump in self._pumps:
            pump.cancel()
        await asyncio.gather(*self._pumps, *self._handlers, return_exceptions=True)

    async def _serve(self, client: asyncio.StreamReader, to_client: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        self._writers.add(to_client)
        to_server: asyncio.StreamWriter | None = None
        try:
            if self._closed:
                return
            try:
                server, to_server = await asyncio.open_connection("127.0.0.1", self.target)
            except OSError:
                return
            self._writers.add(to_server)
            if not self._closed:
                await self._relay(client, to_client, server, to_server)
        finally:
            for writer in (to_client, to_server):
                if writer is not None:
                    writer.close()
                    self._writers.discard(writer)
            self._handlers.discard(handler)

    async def _relay(
        self,
        client: asyncio.StreamReader,
        to_client: asyncio.StreamWriter,
        server: asyncio.StreamReader,
        to_server: asyncio.StreamWriter,
    ) -> None:
        connection = Connection()
        self.connections.append(connection)

        async def pump(
            reader: asyncio.StreamReader, writer: asyncio.StreamWriter, requests: bool
        ) -> None:
            try:
                while data := await reader.read(65536):
                    if requests:
                        connection.requests.extend(
                            f"{m[1].decode()} {m[2].decode()}" for m in REQUEST_LINE.finditer(data)
                        )
                    else:
                        connection.answers += len(STATUS_LINE.findall(data))
                    writer.write(data)
                    await writer.drain()
            except ConnectionError:
                pass
            finally:
                writer.close()

        pumps = {
            asyncio.create_task(pump(client, to_server, True)),
            asyncio.create_task(pump(server, to_client, False)),
        }
        self._pumps.update(pumps)
        await asyncio.gather(*pumps, return_exceptions=True)
        self._pumps.difference_update(pumps)
