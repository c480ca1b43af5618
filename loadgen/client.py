"""The HTTP target: streams requests to an OpenAI-compatible server with httpx.

Connections come from :class:`ClientShards`: enough pooled connections for the
run's designed concurrency (without limit for an uncapped open loop), so requests
never queue inside the client, which would show up as server latency, spread
over small httpx pools because one big httpcore pool costs CPU per request in
proportion to its size. Failures are classified (see :data:`loadgen.records.FAILURE_KINDS`):

* a non-200 status: ``http_429`` (rejected by admission control), ``http_4xx``,
  ``http_5xx`` (other statuses count as ``other``);
* ``timeout``: httpx's connect/read timeout (the run's per-request deadline is
  enforced by the runner and also ends up as ``timeout``);
* ``connection``: refused, reset, or dropped mid-stream, including a stream that
  ends without ``data: [DONE]``;
* ``server_error``: a ``data: {"error": ...}`` chunk.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Iterator
from typing import Any

import httpx

from loadgen.config import LoadConfig
from loadgen.records import FailureKind, RequestFailed, StreamClock
from loadgen.sse import SSEDecoder, parse_chunk
from loadgen.workload import RequestSpec

PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
SHARD_SIZE = 4  # connections per httpx client (4 measured best of 1, 4, 16), see ClientShards


def request_body(config: LoadConfig, spec: RequestSpec) -> dict[str, Any]:
    """The JSON body of one streaming request, for either endpoint."""
    body: dict[str, Any] = {"model": config.model}
    if config.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": spec.prompt}]
    else:
        body["prompt"] = spec.prompt
    body["max_tokens"] = spec.max_tokens
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    if spec.priority is not None:
        body["priority"] = spec.priority
    return body


def status_kind(status: int) -> FailureKind:
    if status == 429:
        return "http_429"
    if 400 <= status < 500:
        return "http_4xx"
    if status >= 500:
        return "http_5xx"
    return "other"


class ClientShards:
    """httpx clients of at most ``shard_size`` connections each, one per request in flight.

    httpcore 1.0's pool rescans every connection it holds whenever a request
    starts or ends (encode/httpx#3215); with hundreds of streams in one pool that
    costs milliseconds of CPU per request and the generator falls behind its
    schedule. Small pools keep that cost constant: a request takes a connection
    from the first client with one free, and a new client is opened when all are
    busy, so no request ever queues inside httpx. Bounded runs open all the
    clients they can need up front; clients share one TLS context (cheap to open).
    """

    def __init__(self, config: LoadConfig, shard_size: int = SHARD_SIZE) -> None:
        self._size = shard_size
        self._ssl = ssl.create_default_context()
        self._headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        self._base_url = config.base_url.rstrip("/")
        self._timeout = httpx.Timeout(config.timeout)
        self._clients: list[httpx.AsyncClient] = []
        self._busy: list[int] = []
        for _ in range(-(-(config.slots or 0) // shard_size)):
            self._open()

    def _open(self) -> int:
        limits = httpx.Limits(max_connections=self._size, max_keepalive_connections=self._size)
        client = httpx.AsyncClient(
            base_url=self._base_url,
            headers=self._headers,
            timeout=self._timeout,
            limits=limits,
            verify=self._ssl,
        )
        self._clients.append(client)
        self._busy.append(0)
        return len(self._clients) - 1

    @contextlib.contextmanager
    def client(self) -> Iterator[httpx.AsyncClient]:
        """A client with a free connection slot, held for the duration of the block."""
        shard = next((i for i, n in enumerate(self._busy) if n < self._size), None)
        if shard is None:
            shard = self._open()
        self._busy[shard] += 1
        try:
            yield self._clients[shard]
        finally:
            self._busy[shard] -= 1

    async def aclose(self) -> None:
        for client in self._clients:
            await client.aclose()


class HttpTarget:
    """Sends each request over HTTP and reports its stream to a :class:`StreamClock`."""

    name = "http"

    def __init__(self, config: LoadConfig) -> None:
        self._config = config
        self._path = PATHS[config.endpoint]
        self._shards = ClientShards(config)

    async def prepare(self) -> None:
        """Open a connection with ``GET /v1/models`` (any answer, or none, will do).

        The first request through httpx runs cold code paths that hold the event
        loop for tens of ms; doing that before the clock starts keeps it out of the
        first requests' send lag. Like vLLM's initial test request, but it neither
        generates tokens nor fails the run.
        """
        with self._shards.client() as client, contextlib.suppress(httpx.HTTPError):
            await client.get("/v1/models", timeout=min(self._config.timeout, 5.0))

    async def aclose(self) -> None:
        await self._shards.aclose()

    async def send(self, spec: RequestSpec, clock: StreamClock) -> None:
        body = request_body(self._config, spec)
        try:
            with self._shards.client() as client:
                clock.sent()
                async with client.stream("POST", self._path, json=body) as response:
                    if response.status_code != 200:
                        text = (await response.aread()).decode("utf-8", "replace")
                        raise RequestFailed(
                            status_kind(response.status_code),
                            f"HTTP {response.status_code}: {text[:500]}",
                        )
                    await _consume(response, clock)
        except httpx.TimeoutException as exc:
            raise RequestFailed("timeout", f"{type(exc).__name__}: {exc}") from exc
        except httpx.TransportError as exc:
            raise RequestFailed("connection", f"{type(exc).__name__}: {exc}") from exc


async def _consume(response: httpx.Response, clock: StreamClock) -> None:
    """Read the SSE body to its end, timestamping content chunks as they arrive."""
    decoder = SSEDecoder()
    done = False
    async for data in response.aiter_bytes():
        done = _handle(decoder.feed(data), clock, done)
    done = _handle(decoder.close(), clock, done)
    if not done:
        raise RequestFailed("connection", "stream ended before data: [DONE]")


def _handle(events: list[str], clock: StreamClock, done: bool) -> bool:
    """Apply parsed events to the clock; return whether [DONE] has been seen."""
    for data in events:
        if done:
            continue  # anything after [DONE] is not part of the answer
        chunk = parse_chunk(data)
        if chunk.done:
            done = True
            continue
        if chunk.content:
            clock.content()
        if chunk.completion_tokens is not None:
            clock.usage(chunk.completion_tokens)
    return done
