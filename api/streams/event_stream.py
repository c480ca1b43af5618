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
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
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

    The chunks are written by a task of their own. A request's task runs the
    route under every middleware, some twenty frames deep, and each time a
    coroutine resumes, every frame between it and its task resumes too: once per
    chunk, for every chunk of every stream. The stream's own task is a few frames
    deep, and the request's task waits for it once.

    On a disconnect that task is cancelled wherever it waits, so ``body``'s
    ``finally`` blocks run (a route cancels its request there) and the response
    ends quietly, as ``StreamingResponse`` does.
    """

    media_type = MEDIA_TYPE

    def __init__(
        self,
        body: AsyncIterator[bytes],
        headers: Mapping[str, str] | None = None,
        *,
        until: Coroutine[Any, Any, None] | None = None,
        final: bytes | Callable[[], bytes] = b"",
    ) -> None:
        self.chunks = body
        self.status_code = 200
        self.background = None
        self.init_headers(HEADERS if headers is None else headers)
        #: Ends the stream when it returns (as a disconnect would), then ``final`` is sent
        #: (made then, where it is a function: a numbered event follows the stream's
        #: last): a revoked key (:func:`api.admission.auth.revoked`).
        self.until = until
        self.final = final

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        streaming = asyncio.create_task(
            self._write(scope.get(SERVER_SEND, send)), name="sse-stream"
        )

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            streaming.cancel()

        watcher = asyncio.create_task(watch(), name="sse-disconnect")
        stopper = None if self.until is None else asyncio.create_task(self.until)
        try:
            await asyncio.wait(
                {streaming} if stopper is None else {streaming, stopper},
                return_when=asyncio.FIRST_COMPLETED,
            )
            if stopper is not None and stopper.done() and not streaming.done():
                streaming.cancel()
                await asyncio.wait({streaming})
                write = scope.get(SERVER_SEND, send)
                final = self.final if isinstance(self.final, bytes) else self.final()
                await write({"type": "http.response.body", "body": final, "more_body": False})
                return
        finally:  # also when this task is cancelled: the stream ends with it
            watcher.cancel()
            if stopper is not None:
                stopper.cancel()
            if not streaming.done():
                streaming.cancel()
                await asyncio.wait({streaming})
            with contextlib.suppress(BaseException):
                await watcher
        if not streaming.cancelled():  # cancelled: the client went away
            streaming.result()  # a failure of the stream is the response's

    async def _write(self, write: Send) -> None:
        try:
            async for chunk in self.chunks:
                await write({"type": "http.response.body", "body": chunk, "more_body": True})
            await write({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            aclose = getattr(self.chunks, "aclose", None)
            if aclose is not None:
                await aclose()
