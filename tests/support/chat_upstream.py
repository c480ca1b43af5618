"""An OpenAI-compatible chat server whose answers the test scripts, for what no real
engine does on demand (a replay that writes another call than the first run).

A real HTTP server (uvicorn, in the test's event loop, on a port of its own) that
speaks what a worker with ``LLMQ_UPSTREAM_ENGINE=generic`` and
``LLMQ_UPSTREAM_API=chat`` uses: ``GET /v1/models`` (discovery and the health
probe) and ``POST /v1/chat/completions`` streamed as OpenAI streams a call:
``chat.completion.chunk`` events, the call's ``id`` and name in its first
``delta.tool_calls``, its arguments one character per chunk, the finish reason
``tool_calls``, the usage chunk (``stream_options.include_usage``), ``[DONE]``.

Each chat request takes the next :class:`ScriptedCall` (the last one answers every
request after it) and is kept in :attr:`ChatUpstream.requests` (its headers in
:attr:`ChatUpstream.headers`). A call with
``hold_after`` stops after that many characters of its arguments and keeps its
stream open until the client goes away: a run that a test cuts mid-call.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import uvicorn
from starlette.types import Receive, Scope, Send

from llmq.embedded import free_port
from tests.support.servers import request_body, start_uvicorn
from tests.support.waiting import wait_until

#: A tool call the scripted upstream answers with, in the tests that use one: its name,
#: the question that asks for it, the tool as a request declares it, and its arguments.
NAME = "reserve_table"
ASK: list[Any] = [{"role": "user", "content": "a table for four at half past seven"}]
TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": NAME,
        "description": "Reserve a table for a party.",
        "parameters": {
            "type": "object",
            "properties": {"party": {"type": "integer"}, "time": {"type": "string"}},
            "required": ["party", "time"],
        },
    },
}
ARGUMENTS = json.dumps({"party": 4, "time": "19:30"})


@dataclass(frozen=True)
class ScriptedCall:
    """One answer: a call of ``name`` with ``arguments`` (streamed a character a chunk)."""

    id: str
    name: str
    arguments: str
    #: Characters of the arguments sent before the stream stalls (None: all, then the end).
    hold_after: int | None = None


class ChatUpstream:
    def __init__(self, model: str, answers: Sequence[ScriptedCall]) -> None:
        assert answers, "a scripted upstream needs at least one answer"
        self.model = model
        self.answers = list(answers)
        self.port = free_port()
        #: The bodies of the chat requests, in arrival order.
        self.requests: list[dict[str, Any]] = []
        #: Their headers (names in lower case), likewise.
        self.headers: list[dict[str, str]] = []
        self._released = asyncio.Event()
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> ChatUpstream:
        server, self._task = start_uvicorn(self, self.port)
        self._server = server
        await wait_until(lambda: server.started, timeout=10, what="the chat upstream to start")
        return self

    async def stop(self) -> None:
        self._released.set()  # a held stream ends
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            async with asyncio.timeout(15):
                await self._task

    def worker_settings(self, **more: Any) -> dict[str, Any]:
        """A worker driving this server: nothing to discover but the model's name."""
        return {
            "model": self.model,
            "backend": "openai",
            "upstream_url": self.url,
            "upstream_engine": "generic",
            "upstream_api": "chat",
            "upstream_capabilities": "tools",
            "upstream_probe_seconds": 0.2,
            "upstream_timeout_seconds": 30,
            **more,
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        method, path = scope["method"], scope["path"]
        if (method, path) == ("GET", "/v1/models"):
            models = {"object": "list", "data": [{"id": self.model, "object": "model"}]}
            await _json(send, 200, models)
        elif (method, path) == ("POST", "/v1/chat/completions"):
            await self._chat(scope, receive, send)
        else:
            await _json(send, 404, {"error": {"message": f"no {method} {path}", "code": None}})

    async def _chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = json.loads(await request_body(receive))
        if not request.get("stream"):
            await _json(send, 400, {"error": {"message": "only streams are scripted"}})
            return
        answer = self.answers[min(len(self.requests), len(self.answers) - 1)]
        self.requests.append(request)
        self.headers.append({k.decode(): v.decode() for k, v in scope["headers"]})
        headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        chunk = _Chunks(f"chatcmpl-{len(self.requests)}", request.get("model") or self.model)
        start = {"index": 0, "id": answer.id, "type": "function"}
        function = {"name": answer.name, "arguments": ""}
        delta = {
            "role": "assistant",
            "content": None,
            "tool_calls": [{**start, "function": function}],
        }
        await _event(send, chunk.delta(delta))
        sent = answer.arguments[: answer.hold_after]
        for piece in sent:
            call = {"index": 0, "function": {"arguments": piece}}
            await _event(send, chunk.delta({"tool_calls": [call]}))
        if len(sent) < len(answer.arguments):
            await self._hold(receive)
            with contextlib.suppress(OSError):  # the client is gone: nothing to end
                await send({"type": "http.response.body", "body": b""})
            return
        await _event(send, chunk.delta({}, finish_reason="tool_calls"))
        if (request.get("stream_options") or {}).get("include_usage"):
            prompt = len(json.dumps(request["messages"]))  # characters: a stand-in's count
            await _event(send, chunk.usage(prompt_tokens=prompt, completion_tokens=len(sent) + 1))
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    async def _hold(self, receive: Receive) -> None:
        """Until the client goes away (or the server stops): a stalled generation."""
        released = asyncio.create_task(self._released.wait())
        gone = asyncio.create_task(_disconnected(receive))
        await asyncio.wait((released, gone), return_when=asyncio.FIRST_COMPLETED)
        for task in (released, gone):
            task.cancel()


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class _Chunks:
    """A stream's ``chat.completion.chunk`` objects, as OpenAI writes them."""

    def __init__(self, completion_id: str, model: str) -> None:
        self.base = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
        }

    def delta(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {**self.base, "choices": [choice]}

    def usage(self, *, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        return {**self.base, "choices": [], "usage": usage}


async def _event(send: Send, data: dict[str, Any]) -> None:
    frame = f"data: {json.dumps(data)}\n\n".encode()
    await send({"type": "http.response.body", "body": frame, "more_body": True})


async def _json(send: Send, status: int, data: dict[str, Any]) -> None:
    body = json.dumps(data).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
