"""The pool policy's fields, defined once: :class:`llmq.policy.model.Policy` holds them,
and every process's settings (:mod:`llmq.settings`) carry them too, as the
environment variables and flags that seed a pool's policy once (docs/policy.md).

Their names are the settings' names without the ``LLMQ_`` prefix, so that an
operator's ``LLMQ_ROUTING=prefix`` is ``llmq config set routing=prefix``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

RoutingName = Literal["fifo", "least-loaded", "hash", "prefix"]
FairnessName = Literal["fifo", "vtc"]
TokenizerName = Literal["whitespace", "chars"]


class PolicyFields(BaseModel):
    """How the pool behaves: routing and its guards, fair share, shedding, admission
    limits, priorities, timeouts, batch bounds and the lifetimes of what the pool writes.
    Every value here may differ per model, except those said to be pool-wide (a file
    has no model, a request's keys outlive its model's choices): there the pool's
    document holds and a model's override is not read."""

    routing: RoutingName = Field(
        "fifo",
        description="Which queued request a worker claims (llmq.protocol.routing): fifo, the "
        "oldest; least-loaded; hash, of the prompt's first block; prefix, the one whose KV "
        "prefix or session the worker holds.",
    )
    routing_window: int = Field(
        16, ge=1, le=256, description="Routed claims choose among this many at the queue's head."
    )
    routing_max_wait_ms: int = Field(
        500,
        ge=0,
        le=600_000,
        description="Routing guard: a request queued this long is any worker's (0: affinity "
        "never holds a request for a busy worker).",
    )
    routing_max_overtakes: int = Field(
        8,
        ge=0,
        le=10_000,
        description="Routing guard: a request that this many later ones overtook is any "
        "worker's next.",
    )
    routing_imbalance: int | None = Field(
        None,
        ge=0,
        le=10_000,
        description="Routing's load guard. Unset: adaptive, a busy worker holding a prompt's "
        "prefix is waited for only while its expected wait for a slot is shorter than "
        "recomputing that prefix elsewhere (both measured by the workers). A number: a worker "
        "running more than this many requests beyond the claiming one is not preferred "
        "(AIBrix's fixed threshold, 8).",
    )
    routing_priority_guard: bool = Field(
        True, description="Routing guard: affinity never lets a request overtake a more urgent one."
    )
    routing_session_ttl_seconds: float = Field(
        600.0, gt=0, description="How long a session (user / X-Session-Id) keeps its worker."
    )
    routing_blocks: int = Field(
        256,
        ge=1,
        le=4096,
        description="Most leading KV blocks (16 tokens each) of a prompt the API names.",
    )
    routing_tokenizer: TokenizerName = Field(
        "whitespace",
        description="How the API cuts prompts into tokens for block names: whitespace (the "
        "mock's), or chars (4 characters a token, for a backend whose tokenizer it lacks).",
    )
    routing_workers: int = Field(
        32, ge=1, le=1024, description="Most live workers a routed claim compares (bounded cost)."
    )
    fairness: FairnessName = Field(
        "vtc",
        description="How a claim shares a priority band among tenants: vtc, the backlogged "
        "tenant with the least weighted service first (see Tenants; a lone tenant is "
        "served in the queue's order); fifo, the queue's order, tenants' weights unused.",
    )
    fairness_slack_tokens: int = Field(
        8192,
        ge=0,
        description="Under LLMQ_ROUTING, how far (weighted tokens) a tenant's counter may be "
        "above the least for cache affinity to choose its requests.",
    )
    shed_wait_seconds: float = Field(
        0.0,
        ge=0,
        description="Refuse (429) a request whose expected queue wait exceeds this (or its "
        "queue timeout); 0: no shedding by expected wait.",
    )
    max_prompt_tokens: int = Field(
        8192, ge=1, description="Longest accepted prompt, in (whitespace) tokens."
    )
    max_tokens_limit: int = Field(4096, ge=1, description="Largest accepted max_tokens.")
    default_max_tokens: int = Field(
        0,
        ge=0,
        description="Most tokens a request that sets no max_tokens may generate; 0: no "
        "bound but what the model's context leaves after the prompt (LLMQ_MAX_TOKENS_LIMIT "
        "where its workers declare no context length).",
    )
    max_queue_depth: int = Field(
        1000, ge=1, description="Requests that may wait per model; more get 429."
    )
    min_priority: int = Field(-1000, description="Lowest accepted priority value.")
    max_priority: int = Field(1000, description="Highest accepted priority value.")
    priority_step_ms: int = Field(
        1000, ge=0, description="Queue-time shift per priority level (see Scheduling)."
    )
    queue_timeout_seconds: float = Field(
        300.0, gt=0, description="Longest a request may wait in the queue (per request: less)."
    )
    generation_timeout_seconds: float = Field(
        600.0, gt=0, description="Longest a request may run (per request: less)."
    )
    max_choices: int = Field(
        20,
        ge=1,
        le=1000,
        description="Most choices one OpenAI request may ask for: n times the number of "
        "prompts; each choice is its own request in the queue.",
    )
    default_tenant: str = Field(
        "default",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="The tenant of LLMQ_API_KEYS keys and of requests that name none "
        "(pool-wide: a request's tenant is known before its model).",
    )
    batch_max_file_bytes: int = Field(
        16 * 1024 * 1024,
        ge=1024,
        le=200 * 1024 * 1024,
        description="Largest file POST /v1/files accepts (stored in Redis), in bytes (pool-wide: "
        "the pool's value).",
    )
    batch_max_lines: int = Field(
        10_000,
        ge=1,
        le=50_000,
        description="Most lines (requests) one batch input file may hold (pool-wide).",
    )
    batch_ttl_seconds: int = Field(
        7 * 86_400,
        ge=60,
        description="Lifetime in Redis of an uploaded file, and of a batch and its output "
        "files once the batch ends (pool-wide).",
    )
    batch_lookahead: int = Field(
        8,
        ge=0,
        le=1000,
        description="Batch lines kept waiting in a model's queue (in the batch band) beyond "
        "its workers' free slots, so a slot that frees starts the next line at once.",
    )
    request_ttl_seconds: int = Field(
        3600,
        ge=10,
        description="Lifetime of a request's record, job and token stream in Redis "
        "(pool-wide: a request's keys outlive its model's choice of anything).",
    )
    stream_maxlen: int = Field(
        10_000,
        ge=16,
        description="Approximate cap on the number of events in one stream (pool-wide).",
    )
    lifecycle_maxlen: int = Field(
        100_000,
        ge=100,
        description="Approximate cap on entries of the lifecycle stream (pool-wide: the "
        "pool has one).",
    )


#: The pool policy's field names, in their order.
POLICY_NAMES: tuple[str, ...] = tuple(PolicyFields.model_fields)
