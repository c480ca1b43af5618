"""OpenTelemetry traces: the one place that configures them, and the spans llmq makes.

Off by default. Tracing is on in a process when the standard environment names an
exporter: ``OTEL_TRACES_EXPORTER`` (``otlp``: OTLP over HTTP, ``console``; a
comma-separated list), or, with it unset, an OTLP endpoint
(``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``); and never
when ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none``. Off, :func:`setup`
sets no tracer provider, :func:`enabled` is False, every helper below returns at once
(callers test ``enabled()`` or a span for None, one attribute read) and no job carries
a trace context. The SDK reads the rest itself: ``OTEL_SERVICE_NAME`` (default:
``llmq-api``, ``llmq-worker``), ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``
and ``OTEL_TRACES_SAMPLER_ARG``, ``OTEL_BSP_*`` (the batch processor's delay and sizes),
the exporter's endpoint, headers and timeout.

A request's trace crosses three processes (docs/observability.md): the API continues
the client's W3C ``traceparent`` (:func:`extract`) or starts a trace, writes its
context into the job (:func:`carrier`, ``JobPayload.trace``), the worker continues it
(:func:`start_job`), and the OpenAI backend sends it to the engine (:func:`inject`).
Spans are made per request, per attempt and per upstream call, never per token.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

log = logging.getLogger(__name__)

#: The W3C trace context: ``traceparent`` and ``tracestate``, the only format llmq
#: reads and writes (vLLM reads the same).
PROPAGATOR = TraceContextTextMapPropagator()

_provider: TracerProvider | None = None
_tracer: trace.Tracer = trace.NoOpTracer()


def exporters() -> list[str]:
    """The exporters the environment names; empty: tracing stays off."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    named = os.environ.get("OTEL_TRACES_EXPORTER")
    if named is None:
        endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        return ["otlp"] if endpoint else []
    return [n.strip().lower() for n in named.split(",") if n.strip().lower() not in ("", "none")]


def setup(service: str) -> bool:
    """Configure this process's tracing from the environment (once, at start); whether
    it is on. ``service``: the service name unless ``OTEL_SERVICE_NAME`` sets one."""
    global _provider, _tracer
    named = exporters()
    if not named or _provider is not None:
        return _provider is not None
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SpanExporter,
    )

    name = os.environ.get("OTEL_SERVICE_NAME") or service
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: name}))
    for exporter_name in named:
        exporter: SpanExporter
        if exporter_name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter()
        elif exporter_name == "console":
            exporter = ConsoleSpanExporter()
        else:
            log.warning("unknown OTEL_TRACES_EXPORTER %r: ignored", exporter_name)
            continue
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _provider = provider
    _tracer = provider.get_tracer("llmq")
    log.info("tracing on: service %s, exporters %s", name, ",".join(named))
    return True


def shutdown() -> None:
    """Flush what is buffered and stop exporting (at the process's stop)."""
    global _provider, _tracer
    if _provider is None:
        return
    _provider.shutdown()
    _provider, _tracer = None, trace.NoOpTracer()


@contextlib.contextmanager
def traced(service: str) -> Iterator[bool]:
    """Tracing set up for the process's life (whether on), flushed when it stops."""
    on = setup(service)
    try:
        yield on
    finally:
        shutdown()


def enabled() -> bool:
    return _provider is not None


def tracer() -> trace.Tracer:
    """llmq's tracer (a no-op one while tracing is off)."""
    return _tracer


def extract(headers: Mapping[str, str]) -> Context:
    """The context a client's ``traceparent`` (and ``tracestate``) carries; an empty
    one (a new trace) without them."""
    return PROPAGATOR.extract(headers)


def carrier(span: Span | None = None) -> dict[str, str] | None:
    """The W3C trace context of ``span`` (default: the current one), for the job;
    None while tracing is off or no span is recording."""
    if _provider is None:
        return None
    span = span if span is not None else trace.get_current_span()
    if not span.get_span_context().is_valid:
        return None
    out: dict[str, str] = {}
    PROPAGATOR.inject(out, trace.set_span_in_context(span))
    return out or None


def inject(span: Span | None) -> dict[str, str] | None:
    """The headers that continue ``span``'s trace at an upstream (None: no span)."""
    if span is None:
        return None
    out: dict[str, str] = {}
    PROPAGATOR.inject(out, trace.set_span_in_context(span))
    return out


def _ns(unix_seconds: float) -> int:
    return int(unix_seconds * 1e9)


#: What the claim of the run about to start in the current task found (set by the
#: worker in that task's context, :func:`note_claim`): :func:`start_job` puts it on
#: the attempt's ``llmq.queue_wait``.
_CLAIM: ContextVar[Mapping[str, Any] | None] = ContextVar("llmq_claim", default=None)


def note_claim(attributes: Mapping[str, Any]) -> None:
    """Attributes of the claim, for the queue wait of the run this task starts (call it
    in the run's task context); nothing while tracing is off."""
    if _provider is not None:
        _CLAIM.set(attributes)


def start_job(
    carried: Mapping[str, str] | None,
    *,
    enqueued_at: float,
    claimed_at: float,
    attributes: Mapping[str, Any],
    run_attributes: Mapping[str, Any],
) -> Span | None:
    """The worker's spans of one attempt, in the trace the job carries (a trace of its
    own without one): ``llmq.queue_wait`` from the enqueue to the claim, ended at once,
    and ``llmq.run``, started at the claim and returned to the runner, which ends it.
    None while tracing is off."""
    if _provider is None:
        return None
    parent = PROPAGATOR.extract(carried) if carried else None
    waited = _tracer.start_span(
        "llmq.queue_wait",
        context=parent,
        start_time=_ns(enqueued_at),
        attributes={**attributes, **(_CLAIM.get() or {})},
    )
    waited.end(end_time=_ns(max(claimed_at, enqueued_at)))
    return _tracer.start_span(
        "llmq.run",
        context=parent,
        start_time=_ns(claimed_at),
        attributes={**attributes, **run_attributes},
    )


def start_batch_line(batch_id: str) -> Span | None:
    """The root span of a batch line's trace (each line its own trace, found by its
    ``llmq.batch.id``); None while tracing is off."""
    if _provider is None:
        return None
    return _tracer.start_span("llmq.batch_line", attributes={"llmq.batch.id": batch_id})


def start_engine(url: str, model: str | None) -> Span | None:
    """The span of one upstream call, a child of the run's span (the current one);
    None while tracing is off or no run's span is current."""
    parent = current()
    if parent is None:
        return None
    attributes: dict[str, Any] = {"url.full": url, "gen_ai.operation.name": "chat"}
    if model:
        attributes["gen_ai.request.model"] = model
    return _tracer.start_span(
        "llmq.engine",
        context=trace.set_span_in_context(parent),
        kind=SpanKind.CLIENT,
        attributes=attributes,
    )


def current() -> Span | None:
    """The current span while tracing is on and one records; else None."""
    if _provider is None:
        return None
    span = trace.get_current_span()
    return span if span.is_recording() else None


def attribute(span: Span | None, key: str, value: Any) -> None:
    """Set an attribute of ``span`` (nothing without one)."""
    if span is not None:
        span.set_attribute(key, value)


def end(span: Span | None, failed: bool = False) -> None:
    """End ``span`` (nothing without one), as an error where ``failed``."""
    if span is None:
        return
    if failed:
        span.set_status(Status(StatusCode.ERROR))
    span.end()


def event(span: Span | None, name: str, at: float | None = None, **attributes: Any) -> None:
    """An event of ``span`` (nothing without one), at Unix time ``at`` (default: now)."""
    if span is not None:
        span.add_event(name, attributes, None if at is None else _ns(at))


def use(span: Span | None) -> AbstractContextManager[Any]:
    """``span`` current in the block and ended after it (nothing without one)."""
    if span is None:
        return contextlib.nullcontext()
    return trace.use_span(span, end_on_exit=True)


def outcome(
    span: Span,
    finish_reason: str,
    *,
    input_tokens: int,
    output_tokens: int,
    cached_tokens: int | None,
    resumed_tokens: int,
    error: str | None = None,
) -> None:
    """How a run ended, on its ``llmq.run`` span (GenAI semantic conventions where
    they have a name: ``gen_ai.usage.*``, ``gen_ai.response.finish_reasons``)."""
    span.set_attribute("gen_ai.response.finish_reasons", [finish_reason])
    span.set_attribute("gen_ai.usage.input_tokens", input_tokens)
    span.set_attribute("gen_ai.usage.output_tokens", output_tokens)
    span.set_attribute("llmq.resumed_tokens", resumed_tokens)
    if cached_tokens is not None:
        span.set_attribute("llmq.cache.hit_tokens", cached_tokens)
    if error is not None:
        span.set_attribute("error.type", error)
        span.set_status(Status(StatusCode.ERROR, error))
