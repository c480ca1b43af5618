"""A request's spans in the API: the request itself and the relay of its answer.

:class:`TraceRequests`, a pure ASGI middleware that :func:`api.app.create_app`
installs only while tracing is on (:mod:`llmq.tracing`), continues the client's W3C
``traceparent`` (or starts a trace) in a ``llmq.request`` server span around the
whole request, current while the route admits it (so that its ``llmq.admission`` span
and the job's trace context are its children), and times the relay to the client as
``llmq.relay``: from the response's start to its end. A stream's chunks do not pass
through the middleware (:class:`api.app._App` hands them the server's own ``send``),
so the relay costs nothing per chunk. Probes and scrapers are not traced.
"""

from __future__ import annotations

from opentelemetry.trace import SpanKind, Status, StatusCode
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llmq import tracing

#: Paths polled by probes and scrapers: no trace.
UNTRACED = frozenset({"/healthz", "/readyz", "/metrics", "/v1/workers", "/v1/metrics/summary"})

_CONTEXT_HEADERS = (b"traceparent", b"tracestate")


class TraceRequests:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNTRACED:
            await self.app(scope, receive, send)
            return
        carried = {
            k.decode("latin-1"): v.decode("latin-1")
            for k, v in scope["headers"]
            if k in _CONTEXT_HEADERS
        }
        tracer = tracing.tracer()
        attributes = {"http.request.method": scope["method"], "url.path": scope["path"]}
        with tracer.start_as_current_span(
            "llmq.request",
            context=tracing.extract(carried),
            kind=SpanKind.SERVER,
            attributes=attributes,
        ) as span:
            relay = None

            async def watched(message: Message) -> None:
                nonlocal relay
                if message["type"] == "http.response.start":
                    status = int(message["status"])
                    span.set_attribute("http.response.status_code", status)
                    if status >= 500:
                        span.set_status(Status(StatusCode.ERROR))
                    relay = tracer.start_span(
                        "llmq.relay", attributes={"http.response.status_code": status}
                    )
                await send(message)

            try:
                await self.app(scope, receive, watched)
            finally:
                if relay is not None:
                    relay.end()
