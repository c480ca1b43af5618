"""The HTTP target: streams requests to an OpenAI-compatible server with aiohttp.

aiohttp, as vLLM's benchmark client uses: the client's own time is part of every
figure it reports, and aiohttp's is the smaller (on a 2-core machine it needs about
half httpx's CPU per streamed token, and less time before a request reaches the
server). One session holds every connection, without a limit, so requests
never queue inside the client, which would show up as server latency. Failures are
classified (see :data:`loadgen.measurements.FAILURE_KINDS`):

* a non-200 status: ``http_429`` (rejected by admission control), ``http_4xx``,
  ``http_5xx`` (other statuses count as ``other``);
* ``timeout``: no connection or no bytes within the run's timeout (the run's
  per-request deadline is enforced by the runner and also ends up as ``timeout``);
* ``connection``: refused, reset or cut before a response status arrived (the
  stream never started);
* ``dropped``: the connection was lost after a 200 status, mid-stream, including
  a stream that ends without ``data: [DONE]``;
* ``server_error``: a ``data: {"error": ...}`` chunk.
"""

from __future__ import annotations

import contextlib
import ssl
from typing import Any

import aiohttp

from llmq.stale_connections import STALE_RETRIES, unsent
from loadgen.config import LoadConfig
from loadgen.measurements import FailureKind, RequestFailed, StreamClock
from loadgen.sse import frames, parse_chunk
from loadgen.workload import RequestSpec

PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


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


class HttpTarget:
    """Sends each request over HTTP and reports its stream to a :class:`StreamClock`."""

    name = "http"

    def __init__(self, config: LoadConfig) -> None:
        self._config = config
        self._url = config.base_url.rstrip("/") + PATHS[config.endpoint]
        self._headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """Created on first use, inside the running loop (aiohttp binds it there)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                connector=aiohttp.TCPConnector(limit=0, ssl=ssl.create_default_context()),
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    sock_connect=self._config.timeout,
                    sock_read=self._config.timeout,
                ),
                auto_decompress=False,
            )
        return self._session

    async def prepare(self) -> None:
        """Open a connection with ``GET /v1/models`` (any answer, or none, will do).

        The first request runs cold code paths that hold the event loop for a few
        ms; doing that before the clock starts keeps it out of the first requests'
        send lag. Like vLLM's initial test request, but it neither generates tokens
        nor fails the run.
        """
        url = self._config.base_url.rstrip("/") + "/v1/models"
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            timeout = aiohttp.ClientTimeout(total=min(self._config.timeout, 5.0))
            async with self.session.get(url, timeout=timeout) as response:
                await response.read()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def send(self, spec: RequestSpec, clock: StreamClock) -> None:
        body = request_body(self._config, spec)
        clock.sent()
        for _ in range(STALE_RETRIES):
            try:
                await self._send(body, clock)
                return
            except _Stale:
                continue  # the pool handed out a connection the server had closed
        await self._send(body, clock, retry_stale=False)

    async def _send(
        self, body: dict[str, Any], clock: StreamClock, retry_stale: bool = True
    ) -> None:
        started = False  # a 200 status line arrived: a lost connection is a drop
        try:
            async with self.session.post(self._url, json=body) as response:
                if response.status != 200:
                    text = (await response.read()).decode("utf-8", "replace")
                    raise RequestFailed(
                        status_kind(response.status), f"HTTP {response.status}: {text[:500]}"
                    )
                started = True
                await _consume(response, clock)
        except TimeoutError as exc:  # aiohttp's ServerTimeoutError is one too
            raise RequestFailed("timeout", f"{type(exc).__name__}: {exc}") from exc
        except aiohttp.ClientError as exc:
            if retry_stale and not started and unsent(exc):
                raise _Stale from exc
            kind: FailureKind = "dropped" if started else "connection"
            raise RequestFailed(kind, f"{type(exc).__name__}: {exc}") from exc


class _Stale(Exception):
    """The request was not written: its pooled connection was closed by the server
    (:mod:`llmq.stale_connections`); sent again, the time it cost stays in its TTFT."""


async def _consume(response: aiohttp.ClientResponse, clock: StreamClock) -> None:
    """Read the SSE body to its end, timestamping content chunks as they arrive."""
    done = False
    async for event in frames(response.content.iter_any()):
        if done:
            continue  # anything after [DONE] is not part of the answer
        chunk = parse_chunk(event.data)
        if chunk.done:
            done = True
            continue
        if chunk.content:
            clock.content()
        if chunk.completion_tokens is not None:
            clock.usage(chunk.completion_tokens)
    if not done:
        raise RequestFailed("dropped", "stream ended before data: [DONE]")
