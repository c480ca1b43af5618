"""Pydantic models of what is stored in Redis: job payloads, stream events, records.

This is the documented contract. A token stream (``llmq.protocol.keys.stream(id)``) holds entries
with two fields: ``type`` (the event's type, for cheap filtering) and ``data`` (the
event as JSON, ``type`` included). Consumers outside llmq can read it with plain
``XREAD``/``XRANGE``; docs/architecture.md lists every event.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from json.encoder import encode_basestring as _json_string
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    ValidationError,
    model_serializer,
)

log = logging.getLogger(__name__)

FinishReason = Literal["stop", "length", "cancelled", "timeout", "error"]
Status = Literal["queued", "running", "done", "failed", "cancelled"]
TERMINAL_STATUSES: frozenset[str] = frozenset({"done", "failed", "cancelled"})


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SamplingParams(_Frozen):
    """Sampling parameters, as the worker's model receives them."""

    max_tokens: int = Field(ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    stop: tuple[str, ...] = ()
    seed: int | None = None
    #: Generate until ``max_tokens`` (the model never stops by itself).
    ignore_eos: bool = False
    #: Tokens generated before the model may stop by itself.
    min_tokens: int = Field(0, ge=0)
    #: Log-probabilities per token with this many alternatives (None: none).
    logprobs: int | None = Field(None, ge=0, le=20)
    #: Structured output: ``{"type": "json_object"}`` or ``{"type": "json_schema",
    #: "schema": {...}}``; None for text.
    response_format: dict[str, Any] | None = None
    #: Function tools the model may call: ``{"name", "parameters"}`` each, and
    #: ``description`` where the request gave one.
    tools: tuple[dict[str, Any], ...] = ()
    #: ``auto``, ``required`` or ``none`` (a named choice arrives as ``required``
    #: with only that tool in ``tools``).
    tool_choice: Literal["auto", "required", "none"] = "auto"
    #: The chat's last message is a tool's result (a model mostly answers it in text).
    after_tool_result: bool = False

    def required_capabilities(self) -> list[tuple[str, str]]:
        """What a model must honour to serve these parameters, each with the request
        parameter that asks for it; plain text needs nothing."""
        needed = []
        if self.logprobs is not None:
            needed.append(("logprobs", "logprobs"))
        if self.response_format is not None:
            needed.append((str(self.response_format.get("type")), "response_format"))
        if self.tools and self.tool_choice != "none":
            needed.append(("tools", "tools"))
        if self.ignore_eos:
            needed.append(("ignore_eos", "ignore_eos"))
        if self.min_tokens:
            needed.append(("min_tokens", "min_tokens"))
        return needed


class EmbedTask(_Frozen):
    """An embedding job: the worker embeds ``inputs`` instead of generating."""

    inputs: tuple[str, ...] = Field(min_length=1)
    #: Components per vector (None: the model's own number).
    dimensions: int | None = Field(None, ge=1)
    #: The same seed and input give the same vector, whichever request asks.
    seed: int = 0


class JobPayload(_Frozen):
    """The job the API enqueues and a worker runs (arq kwarg ``payload``)."""

    request_id: str
    model: str
    prompt: str
    prompt_tokens: int = Field(ge=0)
    params: SamplingParams
    priority: int = 0
    enqueued_at: float = Field(description="Unix time (s) the API accepted the request.")
    queue_deadline: float = Field(description="Unix time (s) after which it must not start.")
    generation_timeout: float = Field(gt=0, description="Seconds it may run once started.")
    #: An embedding request (its ``prompt`` is empty); left out of a generation's job.
    embed: EmbedTask | None = Field(None, exclude_if=lambda v: v is None)
    #: The batch a batch line belongs to (queued in the batch band); left out otherwise.
    batch: str | None = Field(None, exclude_if=lambda v: v is None)
    #: The tenant the request belongs to (:mod:`llmq.tenants`): whose quota it took
    #: and whose share of the pool it is served from; left out when None.
    tenant: str | None = Field(None, exclude_if=lambda v: v is None)
    #: The request's W3C trace context (``traceparent``, and ``tracestate`` when the
    #: trace has one), which the worker's spans continue (:mod:`llmq.tracing`); left
    #: out while the API's tracing is off.
    trace: dict[str, str] | None = Field(None, exclude_if=lambda v: v is None)

    def required_capabilities(self) -> list[tuple[str, str]]:
        """What the serving model must honour, each with the parameter that asks for it."""
        if self.embed is not None:
            return [("embeddings", "input")]
        return self.params.required_capabilities()

    #: A chat request's messages (``role``, ``content``; ``tool_calls`` and
    #: ``tool_call_id`` in an agent's turns), for a backend that applies the model's own
    #: chat template; ``prompt`` is their plain rendering. None: a completion.
    messages: tuple[dict[str, Any], ...] | None = None


class PromptTokensDetails(_Frozen):
    """OpenAI's breakdown of the prompt (vLLM returns it too)."""

    cached_tokens: int = Field(ge=0, description="Prompt tokens served from the KV cache.")


class Usage(_Frozen):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    #: Present when the backend reported how much of the prompt it found cached.
    prompt_tokens_details: PromptTokensDetails | None = None

    @model_serializer(mode="wrap")
    def _without_absent_details(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Without a report, the usage reads as it always has (no null details)."""
        data: dict[str, Any] = handler(self)
        if data.get("prompt_tokens_details", 0) is None:
            del data["prompt_tokens_details"]
        return data


class Timings(_Frozen):
    """Where a request's time went, in milliseconds, measured by the worker."""

    queue_ms: float = Field(description="Accepted by the API -> started by a worker.")
    prefill_ms: float = Field(description="Started -> first token produced.")
    decode_ms: float = Field(description="First token -> last token.")


class StartedEvent(_Frozen):
    """A worker took the request. ``attempt`` > 1 means a re-run after a failure."""

    type: Literal["started"] = "started"
    worker: str
    attempt: int = Field(ge=1)
    queue_ms: float


class TokenLogprob(_Frozen):
    """A token's log-probability and its ``top`` alternatives (token, logprob), best first."""

    logprob: float
    top: list[tuple[str, float]] = Field(default_factory=list)


class TokensEvent(_Frozen):
    """One or more consecutive tokens; ``index`` is the position of the first one.

    ``logprobs``, when the request asked for them, has one entry per token.
    """

    type: Literal["tokens"] = "tokens"
    index: int = Field(ge=0)
    tokens: list[str] = Field(min_length=1)
    #: Written only when asked for: the usual event stays as it was (and readable by
    #: readers that predate the field).
    logprobs: list[TokenLogprob] | None = Field(None, exclude_if=lambda v: v is None)


class ToolCallEvent(_Frozen):
    """The model calls a tool: the tokens from ``index`` on are its JSON arguments."""

    type: Literal["tool_call"] = "tool_call"
    index: int = Field(ge=0)
    id: str
    name: str


class EmbeddingEvent(_Frozen):
    """Vectors of an embedding request's inputs, from input ``index`` on: each the
    base64 of its little-endian float32 components (OpenAI's ``encoding_format:
    base64``), exact and a third the size of JSON numbers."""

    type: Literal["embedding"] = "embedding"
    index: int = Field(ge=0)
    vectors: list[str] = Field(min_length=1)


class DoneEvent(_Frozen):
    """The last event of a request that ended normally or was cancelled."""

    type: Literal["done"] = "done"
    finish_reason: FinishReason
    usage: Usage
    timings: Timings


class ErrorEvent(_Frozen):
    """The last event of a request that failed; ``code`` is machine-readable."""

    type: Literal["error"] = "error"
    code: str
    message: str
    finish_reason: FinishReason = "error"
    usage: Usage | None = None
    #: The request's own fault (the model refused it: a prompt over the context length,
    #: a parameter the engine rejects): a client's error, not the server's.
    refused: bool = Field(False, exclude_if=lambda v: not v)
    #: The request parameter at fault, where the model said.
    param: str | None = Field(None, exclude_if=lambda v: v is None)


Event = Annotated[
    StartedEvent | TokensEvent | ToolCallEvent | EmbeddingEvent | DoneEvent | ErrorEvent,
    Field(discriminator="type"),
]
_EVENT: TypeAdapter[Event] = TypeAdapter(Event)


def is_terminal(event: Event) -> bool:
    return isinstance(event, DoneEvent | ErrorEvent)


_object_setattr = object.__setattr__
#: The fields a token event built by :func:`tokens_event` counts as set (what
#: ``model_construct`` records for them).
_TOKENS_SET = frozenset({"index", "tokens"})


def tokens_event(
    index: int, tokens: list[str], logprobs: list[TokenLogprob] | None = None
) -> TokensEvent:
    """A token event assembled as ``model_construct`` would, without validation or
    ``model_construct``'s loop over the fields: for values this process made itself
    (a worker's tokens) or already checked (the API's reader of token events). Token
    events are nearly every event, and built once per stream per flush and read."""
    event = TokensEvent.__new__(TokensEvent)
    values = {"type": "tokens", "index": index, "tokens": tokens, "logprobs": logprobs}
    _object_setattr(event, "__dict__", values)
    fields_set = set(_TOKENS_SET) if logprobs is None else {*_TOKENS_SET, "logprobs"}
    _object_setattr(event, "__pydantic_fields_set__", fields_set)
    _object_setattr(event, "__pydantic_extra__", None)
    _object_setattr(event, "__pydantic_private__", None)
    return event


def encode_event(event: Event) -> dict[str, str]:
    """The fields of the stream entry that carries ``event``.

    A token event without log-probabilities, nearly every event written, is written
    by hand: the same text as ``model_dump_json`` (each token by the C encoder of
    JSON strings, which escapes as pydantic does), for a third of its cost.
    """
    if type(event) is TokensEvent and event.logprobs is None:
        texts = ",".join(map(_json_string, event.tokens))
        return {
            "type": "tokens",
            "data": f'{{"type":"tokens","index":{event.index},"tokens":[{texts}]}}',
        }
    return {"type": event.type, "data": event.model_dump_json()}


def decode_event(fields: Mapping[bytes, bytes] | Mapping[str, str]) -> Event | None:
    """Parse a stream entry; a malformed or foreign entry is logged and yields None."""
    raw = fields.get("data", fields.get(b"data")) if fields else None  # type: ignore[call-overload]
    if raw is None:
        log.warning("skipping stream entry without data: %r", fields)
        return None
    try:
        return _EVENT.validate_json(raw)
    except ValidationError as exc:
        log.warning("skipping malformed stream entry: %s", exc.errors(include_url=False)[:1])
        return None


class RequestRecord(BaseModel):
    """A request's status and timings (hash ``llmq.protocol.keys.request(id)``)."""

    model_config = ConfigDict(extra="ignore")

    id: str
    model: str
    status: Status
    priority: int = 0
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    worker: str | None = None
    attempts: int = 0
    prompt_tokens: int = 0
    completion_tokens: int | None = None
    #: Prompt tokens the backend found in its prefix cache (when it said).
    cached_tokens: int | None = None
    finish_reason: FinishReason | None = None
    error: str | None = None
    owner: str | None = None
    #: The tenant the request belongs to.
    tenant: str | None = None
    #: Tokens it reserved of its tenant's quota (returned, less what it used, at its end);
    #: None when its tenant has no limits.
    reserved: int | None = None

    def to_redis(self) -> dict[str, str]:
        """Hash fields; unset fields are left out."""
        return {
            k: v if isinstance(v, str) else json.dumps(v)
            for k, v in self.model_dump(exclude_none=True).items()
        }

    @classmethod
    def from_redis(cls, fields: Mapping[str, str]) -> RequestRecord:
        data: dict[str, object] = {}
        for k, v in fields.items():
            try:
                data[k] = json.loads(v)
            except ValueError:
                data[k] = v
        for k in ("id", "model", "status", "worker", "finish_reason", "error", "owner", "tenant"):
            if k in fields:
                data[k] = fields[k]
        return cls.model_validate(data)


LifecycleKind = Literal[
    "queued", "started", "first_token", "finished", "cancelled", "failed", "scaled", "batch"
]


class Lifecycle(BaseModel):
    """One entry of a lifecycle stream (``llmq.protocol.keys.lifecycle(request_id)``).

    Stream fields: ``event``, ``request_id``, ``model`` (for cheap filtering) and
    ``data`` (this model as JSON). Times are Unix seconds; durations milliseconds.
    """

    model_config = ConfigDict(extra="ignore")

    event: LifecycleKind
    request_id: str
    model: str
    ts: float
    priority: int | None = None
    #: The request's tenant (absent for requests without one).
    tenant: str | None = None
    worker: str | None = None
    attempt: int | None = None
    queue_ms: float | None = None
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    finish_reason: FinishReason | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    #: ``scaled`` entries (written by the autoscaler; ``request_id`` is empty).
    direction: Literal["up", "down"] | None = None
    reason: str | None = None
    desired: int | None = None
    actual: int | None = None
    target: int | None = None
    #: ``batch`` entries (the batch feeder's progress; ``request_id`` is the batch's id).
    status: str | None = None
    completed: int | None = None
    failed: int | None = None
    total: int | None = None

    def fields(self) -> dict[str, str]:
        return {
            "event": self.event,
            "request_id": self.request_id,
            "model": self.model,
            "data": self.model_dump_json(exclude_none=True),
        }


class WorkerInfo(BaseModel):
    """A worker's registry entry, refreshed by its heartbeat.

    Unknown fields are ignored, so that entries of newer workers stay readable.
    ``capabilities``: what its model honours beyond plain text (see
    the model interface in docs/architecture.md); None for a worker that does not say.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    id: str
    host: str
    pid: int
    model: str
    concurrency: int
    running: int
    started_at: float
    heartbeat_at: float
    capabilities: tuple[str, ...] | None = None
    #: Its backend's KV cache: the fraction running sequences hold (None: not known),
    #: and prompt tokens looked up in its prefix cache and found, since it started.
    kv_cache_usage: float | None = None
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    #: The tokenizer the API counts this model's prompts with (:mod:`llmq.model.tokenizer`)
    #: and its context length in tokens; None: the mock's whitespace, no length.
    tokenizer: str | None = None
    context_length: int | None = None
    #: Whether its engine keeps a prefix cache (the mock's KV cache does; an upstream's
    #: where its engine is one of :data:`llmq.policy.derived.PREFIX_CACHES`). None: an
    #: entry of a worker that predates the field, judged by its upstream's engine.
    prefix_cache: bool | None = None
    #: False while the worker's model (an upstream server) does not answer: the worker
    #: stays registered but claims nothing.
    ready: bool = True
    #: What the worker found of its upstream inference server (None: the mock):
    #: ``engine``, whether it was ``identified`` (else set), its ``slots``,
    #: ``context_length``, ``tokenize`` endpoint, ``chat`` API (the model's template) and
    #: ``render`` (where and how the engine renders chat messages with it: ``url``,
    #: ``answer`` ``prompt`` or ``tokens``, the body's other ``fields``; None: it does not).
    upstream: dict[str, Any] | None = None
    #: True once an operator drained it (``POST /admin/workers/{id}/drain``): it finishes
    #: its runs and claims nothing more.
    draining: bool = False


class ScaleState(_Frozen):
    """What the autoscaler publishes per model (``llmq:autoscaler:state``), every period."""

    desired: int
    actual: int
    starting: int
    target: int
    #: The most workers it may order (its MIN:MAX bound); 0 in an entry that predates it.
    max_workers: int = 0
    owner: str
    #: Unix seconds after which the entry is stale (its controller stopped or lost the lease).
    expires_at: float
