"""Server-Sent Events: framing, and the response that writes a stream to the client.

:class:`EventStream` is the streaming routes' response. It does what Starlette's
``StreamingResponse`` does for them with less per chunk, which is every token of
every stream: each chunk goes straight to the server's ``send`` (the middleware
wrappers between it and the route only watch the start of a response, which
still goes through them), and a client's disconnect is watched by one task that
cancels the stream, instead of a task group around every response.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

KEEPALIVE = b": keepalive\n\n"
DONE = b"data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
MEDIA_TYPE = "text/event-stream"
#: The scope key under which the application puts the server's own ``send``.
SERVER_SEND = "llmq.server_send"


def data(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def event(event_id: str, kind: str, payload: str) -> bytes:
    return f"id: {event_id}\nevent: {kind}\ndata: {payload}\n\n".encode()


class EventStream(Response):
    """``text/event-stream`` of the chunks ``body`` yields; a disconnect closes ``body``.

    On a disconnect the task sending the stream is cancelled wherever it waits,
    so ``body``'s ``finally`` blocks run (a route cancels its request there) and
    the response ends quietly, as ``StreamingResponse`` does.
    """

    media_type = MEDIA_TYPE

    def __init__(
        self, body: AsyncIterator[bytes], headers: Mapping[str, str] | None = None
    ) -> None:
        self.chunks = body
        self.status_code = 200
        self.background = None
        self.init_headers(HEADERS if headers is None else headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        write: Send = scope.get(SERVER_SEND, send)
        streaming = asyncio.current_task()
        disconnected = False

        async def watch() -> None:
            nonlocal disconnected
            while (await receive())["type"] != "http.disconnect":
                pass
            disconnected = True
            if streaming is not None:
                streaming.cancel()

        watcher = asyncio.create_task(watch(), name="sse-disconnect")
        try:
            async for chunk in self.chunks:
                await write({"type": "http.response.body", "body": chunk, "more_body": True})
            watcher.cancel()
            await write({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not disconnected or streaming is None:
                raise
            streaming.uncancel()
        finally:
            watcher.cancel()
            with contextlib.suppress(BaseException):
                await watcher
            aclose = getattr(self.chunks, "aclose", None)
            if aclose is not None:
                await aclose()
