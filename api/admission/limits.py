"""A pure ASGI middleware that bounds request bodies.

The body is read (at most ``max_bytes``) before the app sees it: a larger body is
answered with 413 in OpenAI's error shape, however it is sent (with or without
Content-Length, chunked or not), and the app never parses it. A file upload
(``POST /v1/files``) has its own bound, the largest batch file plus room for the
multipart framing; that bound is pool policy, read at each upload so that a change
applies without a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import error_body

#: How much of an oversized chunked body is read and dropped before the 413 is sent.
DISCARD_LIMIT = 64 * 1024 * 1024
DISCARD_SECONDS = 5.0
#: Room for a multipart upload's framing beyond the file itself.
MULTIPART_SLACK = 64 * 1024
UPLOADS = "/v1/files"


def _no_uploads() -> int:
    return 0


class BodyLimit:
    def __init__(
        self, app: ASGIApp, max_bytes: int, upload_bytes: Callable[[], int] = _no_uploads
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.upload_bytes = upload_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        if scope["path"] == UPLOADS:
            limit = max(limit, self.upload_bytes() + MULTIPART_SLACK)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self._reject(send, limit)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                if message.get("more_body", False):
                    await self._discard_rest(receive)
                await self._reject(send, limit)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _discard_rest(self, receive: Receive) -> None:
        """Read and drop the rest of the body (bounded), so the client can read the 413."""
        budget = DISCARD_LIMIT

        async def drain() -> None:
            nonlocal budget
            while budget > 0:
                message = await receive()
                budget -= len(message.get("body", b""))
                if message["type"] != "http.request" or not message.get("more_body", False):
                    return

        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(DISCARD_SECONDS):
                await drain()

    async def _reject(self, send: Send, limit: int) -> None:
        payload = json.dumps(
            error_body(
                f"the request body exceeds {limit} bytes",
                "invalid_request_error",
                None,
                "request_too_large",
            )
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                    (b"connection", b"close"),
                    (b"x-should-retry", b"false"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})
