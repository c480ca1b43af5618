"""SSE responses in tests, read by the load generator's reader (:mod:`loadgen.sse`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx

from loadgen.sse import Frame
from loadgen.sse import frames as read_frames


async def frames(response: httpx.Response) -> AsyncIterator[Frame]:
    """Frames of an SSE response, comments skipped, in arrival order."""
    async for frame in read_frames(response.aiter_bytes()):
        yield frame


async def openai_chunks(response: httpx.Response) -> list[Any]:
    """The JSON chunks of an OpenAI stream; asserts it ends with ``[DONE]``."""
    chunks: list[Any] = []
    done = False
    async for frame in frames(response):
        assert not done, "data after [DONE]"
        if frame.data == "[DONE]":
            done = True
        else:
            chunks.append(frame.json())
    assert done, "stream did not end with [DONE]"
    return chunks


async def stream_completion(
    client: httpx.AsyncClient, max_tokens: int, started: asyncio.Event
) -> tuple[str, list[Any]]:
    """(text, error chunks) of a streaming completion; asserts it ends with [DONE]."""
    body = {"model": "mock", "prompt": "go", "max_tokens": max_tokens, "stream": True}
    text, errors, done = "", [], False
    async with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        async for frame in frames(response):
            assert not done, "data after [DONE]"
            if frame.data == "[DONE]":
                done = True
                continue
            chunk = frame.json()
            if "error" in chunk:
                errors.append(chunk["error"])
            elif chunk["choices"]:
                text += chunk["choices"][0]["text"]
                started.set()
    assert done, "the stream was cut: no [DONE]"
    return text, errors
