"""A worker's upstream client on connections the server closes without saying so.

A real TCP server on a port of its own plays the upstream: it hangs up on the first
connections it accepts once it has read their request, before any status line (what
a client meets when its pool hands out a kept-alive connection the server had
closed: llama.cpp's server closes one after each streamed response), then streams a
completion on the next. The request goes again on a new connection and the stream
arrives whole; the upstream is not counted as down. A server that hangs up on every
try still fails the attempt.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from llmq.model.interface import GenerationRequest, Output, Report
from llmq.stale_connections import STALE_RETRIES
from worker.backends.engines import ENGINES
from worker.backends.openai import OpenAIUpstream, UpstreamDown

pytestmark = pytest.mark.timeout(30)

TOKENS = ["a", "b", "c"]


def _stream() -> bytes:
    events = [{"choices": [{"index": 0, "text": t, "finish_reason": None}]} for t in TOKENS]
    events.append({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    body += b"data: [DONE]\n\n"
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    return head + body


class HangingUp:
    """Hangs up on the first ``hang_ups`` requests after reading them, streams after."""

    def __init__(self, hang_ups: int) -> None:
        self.hang_ups = hang_ups
        self.requests = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        await reader.readexactly(length)
        self.requests += 1
        if self.requests > self.hang_ups:
            writer.write(_stream())
            await writer.drain()
        writer.close()


async def _generate(hang_ups: int) -> tuple[list[object], int, int]:
    upstream = HangingUp(hang_ups)
    server = await asyncio.start_server(upstream.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    backend = OpenAIUpstream(
        f"http://127.0.0.1:{port}",
        ENGINES["generic"],
        model="m",
        slots=1,
        capabilities=frozenset(),
        timeout=5.0,
    )
    downs = 0

    def down() -> None:
        nonlocal downs
        downs += 1

    backend.on_down = down
    request = GenerationRequest(prompt="p", max_tokens=len(TOKENS), seed=0, prompt_tokens=1)
    outs: list[object] = []
    try:
        stream: AsyncIterator[Output] = backend.generate(request)
        async for out in stream:
            outs.append(out)
    finally:
        await backend.aclose()
        server.close()
        await server.wait_closed()
    return outs, upstream.requests, downs


async def test_a_request_the_server_hung_up_on_unanswered_goes_again() -> None:
    outs, requests, downs = await _generate(hang_ups=2)
    assert [str(o) for o in outs if not isinstance(o, Report)] == TOKENS
    assert requests == 3 and downs == 0


async def test_a_server_that_hangs_up_on_every_try_fails_the_attempt() -> None:
    with pytest.raises(UpstreamDown):
        await _generate(hang_ups=STALE_RETRIES + 1)
