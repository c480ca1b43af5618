"""The floor: the leanest in-process server that streams OpenAI chunks at the model's pace.

A queue between the API and the model costs CPU per token (a stream entry, a
relay, another process). What a user gives up for it is measured against this:
uvicorn serving a raw ASGI app (no framework, no Redis, no queue) that runs the
project's :class:`~worker.mock.MockBackend` in its own event loop and writes each
token as an OpenAI SSE chunk the moment the model yields it. The most streams it
holds within the ITL limit, with the same client and timing, is the number llmq's
capacity is judged by (``bench/scenarios/capacity.py``).

It speaks just enough of the OpenAI surface for ``llmq loadgen``, the openai SDK
and curl: ``POST /v1/completions`` and ``/v1/chat/completions`` (streaming or
not, ``stream_options.include_usage``), ``GET /v1/models`` and ``/healthz``.
Each chunk's envelope is encoded once per request and only the token text per
chunk, and one ``send`` carries one chunk, as any straightforward server does.

Run it with ``python -m bench.floor --port 8100 --tokens-per-second 50``.
"""

from __future__ import annotations

import argparse
import json
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping, Sequence
from typing import Any

import uvicorn

from llmq.model.interface import GenerationRequest, Output, seed_for
from llmq.model.tokenizer import count_tokens
from worker.mock import MockBackend

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

MAX_BODY_BYTES = 1 << 20
SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
]
JSON_HEADERS = [(b"content-type", b"application/json")]
DONE = b"data: [DONE]\n\n"


def _encode(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


class _Shape:
    """One request's chunk envelopes: completion or chat, encoded once per request."""

    def __init__(self, chat: bool, model: str, include_usage: bool) -> None:
        self.chat = chat
        self.include_usage = include_usage
        self.base: dict[str, Any] = {
            "id": ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12),
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": model,
        }
        placeholder = "\x00text\x00"
        whole = self.frame(self.choice(placeholder, None))
        self.prefix, _, self.suffix = whole.partition(json.dumps(placeholder).encode())

    def choice(self, text: str | None, finish: str | None) -> dict[str, Any]:
        if self.chat:
            delta = {} if text is None else {"content": text}
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}

    def frame(self, choice: dict[str, Any] | None, usage: dict[str, int] | None = None) -> bytes:
        body = {**self.base, "choices": [choice] if choice else []}
        if self.include_usage:
            body["usage"] = usage
        return b"data: " + _encode(body) + b"\n\n"

    def token(self, text: str) -> bytes:
        return self.prefix + json.dumps(text).encode() + self.suffix

    def opening(self) -> bytes | None:
        if not self.chat:
            return None
        role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None}
        return self.frame({**role, "finish_reason": None})

    def full(self, text: str, finish: str, usage: dict[str, int]) -> bytes:
        if self.chat:
            message = {"role": "assistant", "content": text}
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
            obj = "chat.completion"
        else:
            choice = self.choice(text, finish)
            obj = "text_completion"
        return _encode({**self.base, "object": obj, "choices": [choice], "usage": usage})


class FloorApp:
    """The raw ASGI application: the model runs in the server's own event loop."""

    def __init__(self, model: MockBackend, model_name: str = "mock") -> None:
        self.model = model
        self.model_name = model_name

    async def startup(self) -> None:
        """Before the first request (a subclass connects what its tokens pass through)."""

    async def shutdown(self) -> None:
        """After the last request."""

    def tokens(self, request: GenerationRequest, stream_id: str) -> AsyncIterator[Output]:
        """The request's outputs as the model yields them (the tokens are the ``str``
        ones); ``stream_id`` is the response's id.

        The one place a variant of the floor changes (``bench.floor_via_redis``
        passes them through Redis), so that everything else it measures is the floor.
        """
        return self.model.generate(request)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(self, receive, send)
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            body = await _body(receive)
            if body is None:
                await _json(send, 413, _error("request body too large"))
                return
            await self._generate(send, body, chat=path.endswith("chat/completions"))
        elif method == "GET" and path == "/v1/models":
            data = [{"id": self.model_name, "object": "model", "created": 0, "owned_by": "floor"}]
            await _json(send, 200, _encode({"object": "list", "data": data}))
        elif method == "GET" and path == "/healthz":
            await _json(send, 200, b'{"status":"ok"}')
        else:
            await _json(send, 404, _error(f"no route {method} {path}"))

    async def _generate(self, send: Send, raw: bytes, *, chat: bool) -> None:
        try:
            body = json.loads(raw)
            prompt = _prompt(body, chat)
            max_tokens = int(body.get("max_tokens") or 16)
            temperature = float(body.get("temperature", 1.0))
        except (ValueError, TypeError, KeyError, AttributeError):
            await _json(send, 400, _error("invalid request body"))
            return
        options = body.get("stream_options") or {}
        shape = _Shape(
            chat, str(body.get("model", self.model_name)), bool(options.get("include_usage"))
        )
        request = GenerationRequest(
            prompt=prompt,
            max_tokens=max_tokens,
            seed=seed_for(shape.base["id"], _seed(body)),
            prompt_tokens=count_tokens(prompt),
            temperature=temperature,
        )
        if not body.get("stream"):
            outputs = self.tokens(request, shape.base["id"])
            tokens = [token async for token in outputs if isinstance(token, str)]
            finish = "length" if len(tokens) >= max_tokens else "stop"
            usage = _usage(request.prompt_tokens, len(tokens))
            await _json(send, 200, shape.full("".join(tokens), finish, usage))
            return
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        opening = shape.opening()
        if opening is not None:
            await send({"type": "http.response.body", "body": opening, "more_body": True})
        count = 0
        async for token in self.tokens(request, shape.base["id"]):
            if not isinstance(token, str):
                continue  # a report of the model's cache: not a token
            count += 1
            await send(
                {"type": "http.response.body", "body": shape.token(token), "more_body": True}
            )
        finish = "length" if count >= max_tokens else "stop"
        tail = shape.frame(shape.choice(None, finish))
        if shape.include_usage:
            tail += shape.frame(None, _usage(request.prompt_tokens, count))
        await send({"type": "http.response.body", "body": tail + DONE, "more_body": False})


def _seed(body: dict[str, Any]) -> int | None:
    """The request's ``seed``, so that two servers asked the same produce the same text."""
    seed = body.get("seed")
    return None if seed is None else int(seed)


def _prompt(body: dict[str, Any], chat: bool) -> str:
    if chat:
        return "\n".join(f"{m['role']}: {m['content']}" for m in body["messages"])
    prompt = body["prompt"]
    return prompt if isinstance(prompt, str) else " ".join(prompt)


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _error(message: str) -> bytes:
    return _encode({"error": {"message": message, "type": "invalid_request_error"}})


async def _body(receive: Receive) -> bytes | None:
    """The whole request body, or None past :data:`MAX_BODY_BYTES`."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return None
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


async def _json(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": JSON_HEADERS})
    await send({"type": "http.response.body", "body": body})


async def _lifespan(app: FloorApp, receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await app.startup()
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await app.shutdown()
            await send({"type": "lifespan.shutdown.complete"})
            return


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.floor", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--tokens-per-second", type=float, default=50.0)
    parser.add_argument("--prefill-seconds-per-token", type=float, default=0.0001)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    model = MockBackend(
        tokens_per_second=args.tokens_per_second,
        prefill_seconds_per_token=args.prefill_seconds_per_token,
    )
    serve(FloorApp(model), args.host, args.port)


def serve(app: Any, host: str, port: int) -> None:
    """Serve ``app`` as every floor server does: no access log, lifespan on, a short
    graceful shutdown (the benchmark stops servers between levels)."""
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=5,
    )


if __name__ == "__main__":
    main()
