"""The HTTP client against a real (uvicorn) stand-in for an external OpenAI-compatible server.

The stub is not llmq: it serves canned OpenAI-shaped SSE so the client's wire
handling (streaming, timing, failure classes, pool sizing) is tested alone. The
request's ``model`` field picks the scenario.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn

from loadgen import LoadConfig, run_load
from tests.support.servers import request_body

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


@dataclass
class Stub:
    """An ASGI app streaming canned answers; records what it was sent."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    in_flight: int = 0
    peak: int = 0
    barrier: int = 0  # scenario "barrier": hold every answer until this many are in flight
    released: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        body = json.loads(await request_body(receive))
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.requests.append({"path": scope["path"], "body": body, "headers": headers})
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await self._answer(body, scope["path"], receive, send)
        finally:
            self.in_flight -= 1

    async def _answer(self, body: dict[str, Any], path: str, receive: Receive, send: Send) -> None:
        scenario = body["model"]
        if scenario == "barrier":
            if self.in_flight >= self.barrier:
                self.released.set()
            await self.released.wait()
        status = {"reject": 429, "bad": 400, "crash": 503}.get(scenario)
        if status is not None:
            await _respond(send, status, b'{"error": {"message": "no"}}', "application/json")
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        chat = path.endswith("/chat/completions")
        if chat:
            await _chunk(send, {"choices": [{"index": 0, "delta": {"role": "assistant"}}]})
        # Two tokens per content chunk (like a worker coalescing), in pieces split mid-event.
        tokens = int(body["max_tokens"])
        for start in range(0, tokens, 2):
            text = " tok" * min(2, tokens - start)
            choice = {"index": 0, "delta": {"content": text}} if chat else {"text": text}
            payload = f"data: {json.dumps({'choices': [choice]})}\n\n".encode()
            await _piece(send, payload[:7])
            await asyncio.sleep(0.002)  # generation time between chunks
            await _piece(send, payload[7:] + b": keep-alive\n\n")
            if scenario == "error" and start == 0:
                await _chunk(send, {"error": {"message": "worker lost", "type": "internal"}})
            if scenario == "stall":
                await receive()  # returns when the client gives up and disconnects
                return
            if scenario == "drop":
                raise ConnectionAbortedError("stub drops the connection mid-stream")
        if scenario == "truncate":
            await _piece(send, b"", more=False)
            return
        await _chunk(send, {"choices": [], "usage": {"completion_tokens": tokens}})
        await _piece(send, b"data: [DONE]\n\n", more=False)


async def _respond(send: Send, status: int, body: bytes, kind: str) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", kind.encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _piece(send: Send, data: bytes, more: bool = True) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": more})


async def _chunk(send: Send, obj: object) -> None:
    await _piece(send, f"data: {json.dumps(obj)}\n\n".encode())


@dataclass
class Running:
    url: str
    stub: Stub


@pytest.fixture
async def server() -> AsyncIterator[Running]:
    """Uvicorn on an already-listening socket: connections queue until it accepts."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    stub = Stub()
    config = uvicorn.Config(
        stub,
        lifespan="off",
        log_level="critical",
        access_log=False,
        http="h11",
        ws="none",
        timeout_graceful_shutdown=2,
    )
    uv = uvicorn.Server(config)
    task = asyncio.create_task(uv.serve(sockets=[sock]))
    yield Running(f"http://127.0.0.1:{sock.getsockname()[1]}", stub)
    uv.should_exit = True
    await task
    sock.close()


def _config(url: str, **overrides: object) -> LoadConfig:
    base: dict[str, object] = {
        "base_url": url,
        "model": "ok",
        "num_requests": 4,
        "prompt_tokens": (3, 3),
        "output_tokens": (5, 5),
        "timeout": 10.0,
    }
    base.update(overrides)
    return LoadConfig(**base)  # type: ignore[arg-type]


async def test_completions_stream_is_measured(server: Running) -> None:
    config = _config(server.url, api_key="k3y", priority_mix=((2, 1.0),), request_rate=500.0)
    result = await run_load(config)
    s = result.summary()
    assert s["completed"] == 4 and s["failed"] == 0 and result.target == "http"
    for measurement in result.measurements:
        assert measurement.output_tokens == 5  # from usage, although only 3 content chunks came
        assert len(measurement.itl_s) == 2
        assert (
            measurement.ttft_s is not None
            and measurement.ttft_s > 0
            and measurement.e2e_s is not None
        )
        assert measurement.tpot_s == pytest.approx((measurement.e2e_s - measurement.ttft_s) / 4)
        assert measurement.priority == 2
    sent = server.stub.requests[0]
    assert sent["path"] == "/v1/completions"
    assert sent["headers"]["authorization"] == "Bearer k3y"
    body = sent["body"]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 5 and body["priority"] == 2
    assert len(body["prompt"].split()) == 3 and "messages" not in body


async def test_chat_stream_ignores_the_role_chunk(server: Running) -> None:
    result = await run_load(_config(server.url, endpoint="chat", num_requests=2))
    assert result.summary()["completed"] == 2
    sent = server.stub.requests[0]
    assert sent["path"] == "/v1/chat/completions"
    assert sent["body"]["messages"][0]["role"] == "user"
    assert "priority" not in sent["body"]
    assert all(len(r.itl_s) == 2 and r.output_tokens == 5 for r in result.measurements)


@pytest.mark.parametrize(
    ("scenario", "kind"),
    [
        ("reject", "http_429"),
        ("bad", "http_4xx"),
        ("crash", "http_5xx"),
        ("error", "server_error"),
        ("drop", "dropped"),
        ("truncate", "dropped"),
        ("stall", "timeout"),
    ],
)
async def test_failures_are_classified(server: Running, scenario: str, kind: str) -> None:
    result = await run_load(_config(server.url, model=scenario, num_requests=2, timeout=0.5))
    s = result.summary()
    assert s["completed"] == 0
    assert s["failures"][kind] == 2, [r.error for r in result.measurements]
    assert all(r.error for r in result.measurements)


async def test_connection_refused_is_a_connection_failure() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    result = await run_load(_config(f"http://127.0.0.1:{port}", num_requests=2))
    failures = result.summary()["failures"]
    assert (failures["connection"], failures["dropped"]) == (2, 0)


async def test_max_concurrency_caps_in_flight_requests(server: Running) -> None:
    result = await run_load(_config(server.url, num_requests=8, max_concurrency=2))
    assert result.summary()["completed"] == 8
    assert server.stub.peak == 2
    assert sum(r.slot_wait_s > 0.001 for r in result.measurements) >= 4
    assert result.summary()["lagged"] is False  # waiting for a slot is not lag


@pytest.mark.parametrize("cap", [None, 12])
async def test_client_does_not_serialize_concurrent_streams(
    server: Running, cap: int | None
) -> None:
    # The server answers nobody until all 12 are in flight: a client pool smaller
    # than the run's concurrency would deadlock into timeouts.
    server.stub.barrier = 12
    config = _config(server.url, model="barrier", num_requests=12, max_concurrency=cap)
    result = await run_load(config)
    assert result.summary()["completed"] == 12
    assert server.stub.peak == 12


async def test_http_and_in_process_get_the_same_traffic(server: Running) -> None:
    shape: dict[str, object] = {
        "num_requests": 6,
        "prompt_tokens": (2, 9),
        "output_tokens": (2, 6),
        "priority_mix": ((0, 1.0), (3, 1.0)),
        "seed": 12,
        "request_rate": 300.0,
    }
    http = await run_load(_config(server.url, **shape))
    local = await run_load(_config(server.url, in_process=True, tokens_per_second=500.0, **shape))

    def traffic(measurements: list[Any]) -> list[tuple[int, int | None, int, int]]:
        return [(r.index, r.priority, r.prompt_tokens, r.max_tokens) for r in measurements]

    assert traffic(http.measurements) == traffic(local.measurements)
    due = [r.scheduled_s for r in local.measurements]
    assert [r.scheduled_s for r in http.measurements] == pytest.approx(due, abs=1e-9)
    prompts = [len(req["body"]["prompt"].split()) for req in server.stub.requests]
    assert sorted(prompts) == sorted(r.prompt_tokens for r in local.measurements)
