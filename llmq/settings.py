"""Settings, one class per process, read from ``LLMQ_*`` environment variables.

Each process builds its settings once (``ApiSettings()``, ``WorkerSettings()``...)
and passes them in; nothing reads the environment at import time. Fields shared
by every process live in :class:`CommonSettings`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from llmq.policy.fields import PolicyFields

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]


def _api_processes() -> Any:
    """The ``api_processes`` setting, of ``llmq api`` and of ``llmq run`` alike."""
    return Field(
        1,
        ge=1,
        le=64,
        description="API processes serving one port (SO_REUSEPORT), each with its own relay "
        "and liveness lease, supervised (restarted with backoff); for hosts with more cores.",
    )


class CommonSettings(BaseSettings, PolicyFields):
    """What every llmq process needs: where Redis is, liveness, logging; and the
    pool policy's fields (:class:`~llmq.policy.fields.PolicyFields`), which only seed a
    pool's policy (docs/policy.md)."""

    model_config = SettingsConfigDict(env_prefix="LLMQ_", extra="ignore", frozen=True)

    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        description="Redis URL; password and TLS (rediss://) come through it.",
    )
    redis_max_connections: int = Field(
        0,
        ge=0,
        le=10_000,
        description="Size of each process's Redis connection pool; 0: from its concurrency.",
    )
    redis_pool_timeout_seconds: float = Field(
        2.0, gt=0, description="How long a command waits for a free pooled connection."
    )
    redis_socket_timeout_seconds: float = Field(
        5.0, gt=0, description="Socket timeout of non-blocking Redis commands."
    )
    worker_ttl_seconds: float = Field(
        5.0, gt=0, description="A worker whose heartbeat is older than this counts as dead."
    )
    sweep_seconds: float = Field(
        0.25, gt=0, description="Interval of the sweep that expires overdue queued requests."
    )
    log_level: LogLevel = "INFO"
    log_json: bool = Field(False, description="One JSON object per log line.")
    redis_sentinels: str = Field(
        "",
        description="Comma-separated host:port of Redis Sentinels; set: the primary is found "
        "through them (and followed across failovers), LLMQ_REDIS_URL gives only password, "
        "username, db and TLS.",
    )
    redis_sentinel_master: str = Field(
        "llmq", min_length=1, description="Name of the primary the Sentinels monitor."
    )

    def sentinel_addresses(self) -> list[tuple[str, int]]:
        """``redis_sentinels`` parsed; empty when Sentinel is not used."""
        out = []
        for item in self.redis_sentinels.split(","):
            if item.strip():
                host, _, port = item.strip().rpartition(":")
                out.append((host, int(port)))
        return out

    @model_validator(mode="after")
    def _sentinels_parse(self) -> CommonSettings:
        for item in self.redis_sentinels.split(","):
            host, sep, port = item.strip().rpartition(":")
            if item.strip() and not (host and sep and port.isdigit() and 0 < int(port) < 65536):
                raise ValueError(f"redis_sentinels: {item.strip()!r} is not host:port")
        return self


class ApiSettings(CommonSettings):
    """Settings of one API process (``llmq api``)."""

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    api_keys: str = Field(
        "",
        description="Comma-separated API keys; empty: no auth. With keys, a request is "
        "visible only with the key that created it.",
    )
    tenant_keys: bool = Field(
        False,
        description="Keys made with `llmq key create` authenticate requests, each for its "
        "tenant (auth is on even if LLMQ_API_KEYS is empty).",
    )
    tenant_header: str = Field(
        "",
        description="Without auth: the request header that names the tenant, set by a trusted "
        "gateway in front (e.g. X-Tenant); empty: every request is the default tenant's.",
    )
    tenants_file: str = Field(
        "", description="A TOML file of tenants (and key digests) written into Redis at start."
    )
    max_body_bytes: int = Field(
        1_048_576, ge=1024, description="Largest accepted request body, in bytes."
    )
    accept_models: str = Field(
        "",
        description="Comma-separated models accepted while no worker serves them; their "
        "requests wait up to their queue timeout. Empty: such requests get 503.",
    )
    relay_block_ms: int = Field(
        5000, ge=10, le=60_000, description="Block time of the shared XREAD that relays streams."
    )
    sse_keepalive_seconds: float = Field(
        15.0, gt=0, description="Interval of SSE comment lines while a stream is idle."
    )
    heartbeat_seconds: float = Field(
        1.0, gt=0, description="Interval at which the API process renews its liveness lease."
    )
    log_prompts: bool = Field(
        False,
        description="Log each accepted request's prompt (off: prompts never reach the logs).",
    )
    orphan_grace_seconds: float = Field(
        5.0,
        gt=0,
        description="If this API process dies, its OpenAI-API requests (whose clients cannot "
        "resume) are cancelled after this long.",
    )
    max_embedding_inputs: int = Field(
        2048, ge=1, le=100_000, description="Most inputs one embeddings request may hold."
    )
    max_embedding_dimensions: int = Field(
        4096, ge=1, le=65_536, description="Largest dimensions an embeddings request may ask for."
    )
    batch_feed_seconds: float = Field(
        0.05, gt=0, le=10, description="Interval of the batch feeder's loop."
    )

    enqueue_min_replicas: int = Field(
        0,
        ge=0,
        le=16,
        description="Answer an accepted request only once this many Redis replicas hold its "
        "enqueue (WAIT); 0: do not wait. Not acknowledged in time: 503 and it is cancelled.",
    )
    enqueue_replica_timeout_ms: int = Field(
        500, ge=1, le=60_000, description="How long an enqueue waits for replicas (WAIT)."
    )
    api_processes: int = _api_processes()

    shutdown_grace_seconds: float = Field(
        2.0,
        ge=0,
        le=600,
        description="On SIGTERM, how long open streams may go on before the API ends them "
        "with an error chunk and [DONE].",
    )

    @model_validator(mode="after")
    def _grace_outlives_heartbeat(self) -> ApiSettings:
        if self.orphan_grace_seconds <= self.heartbeat_seconds:
            raise ValueError("orphan_grace_seconds must be longer than heartbeat_seconds")
        return self


class WorkerSettings(CommonSettings):
    """Settings of one worker process (``llmq worker``)."""

    model: str = Field("mock", min_length=1, max_length=128, description="Model name served.")
    concurrency: int = Field(8, ge=1, le=10_000, description="Requests one worker runs at once.")
    model_tokens_per_second: float = Field(50.0, gt=0, description="Mock decode speed.")
    model_prefill_seconds_per_token: float = Field(
        0.0001, ge=0, description="Mock prefill time per prompt token."
    )
    model_stop_probability: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Chance per token that the mock ends with 'stop' (above 0, it replaces "
        "model_mean_tokens).",
    )
    model_embedding_dimensions: int = Field(
        1536, ge=1, le=65_536, description="Mock embedding size when a request sets none."
    )
    model_mean_tokens: int = Field(
        32,
        ge=0,
        description="Mean length of a mock answer that stops by itself, as a real model's "
        "mostly do: a chance of 1/mean per token to end with 'stop' (0: answers run to "
        "max_tokens; requests keep fixed lengths with ignore_eos or min_tokens).",
    )

    def mock_stop_probability(self) -> float:
        """The mock's chance per token to stop: the probability if set, else 1/mean."""
        if self.model_stop_probability or not self.model_mean_tokens:
            return self.model_stop_probability
        return 1.0 / self.model_mean_tokens

    # The mock's engine model (docs/routing.md, "The mock engine").
    model_profile: str = Field(
        "default",
        description="The mock engine's figures: 'default' (50 tokens/s, cheap prefill) or "
        "'llama3-70b-h100x2' (calibrated); the model_* settings given explicitly override them.",
    )
    model_kv_blocks: int = Field(
        0, ge=0, description="Mock KV cache capacity in blocks (0: the profile's)."
    )
    model_kv_block_size: int = Field(
        16, ge=1, le=1024, description="Tokens per mock KV block (the API's routing blocks)."
    )
    model_step_token_budget: int = Field(
        0, ge=0, description="Most tokens one mock engine step computes (0: the profile's)."
    )
    worker_token_budget: int = Field(
        0,
        ge=0,
        description="Token-aware admission: most prompt + max_tokens a worker runs at once "
        "(0: off). An idle worker always takes the next request.",
    )
    poll_seconds: float = Field(
        0.5, gt=0, description="Fallback poll of the queue when no wake-up arrives."
    )
    heartbeat_seconds: float = Field(
        0.25, gt=0, description="Registry heartbeat and lease renewal interval."
    )
    lease_seconds: float = Field(
        1.0,
        gt=0,
        description="A running request whose worker has not renewed its lease for this "
        "long goes back to the queue (the worker is presumed dead).",
    )
    lease_self_expiry: bool = Field(
        True,
        description="A worker that cannot renew a running request's lease stops generating "
        "it when the lease would expire by its own clock (from its last successful renewal, "
        "minus lease_margin_seconds), without waiting for Redis to say it is lost.",
    )
    lease_margin_seconds: float = Field(
        0.1,
        ge=0,
        description="How much earlier than the lease a worker that cannot renew gives up.",
    )
    job_timeout_seconds: float = Field(
        600.0, gt=0, description="Hard limit on one request's run time in a worker."
    )
    max_tries: int = Field(
        3, ge=1, le=20, description="Runs of one request (crashes, model errors) before it fails."
    )
    drain_seconds: float = Field(
        10.0, ge=0, description="On SIGTERM, how long running requests may finish."
    )
    max_event_tokens: int = Field(
        256, ge=1, description="Most tokens coalesced into one stream event."
    )
    model_load_seconds: float = Field(
        0.0,
        ge=0,
        le=3600,
        description="Time the model takes to load: the worker registers and claims only "
        "after it (what an autoscaler must plan for).",
    )
    # The model behind the worker (worker/backends/): the mock, or an OpenAI-compatible
    # inference server beside it (vLLM, SGLang, TGI, llama.cpp, Ollama).
    backend: Literal["mock", "openai"] = Field(
        "mock", description="The model: the mock, or an OpenAI-compatible upstream server."
    )
    upstream_url: str = Field(
        "",
        description="Base URL of the upstream inference server (backend openai), without "
        "/v1, e.g. http://127.0.0.1:8080.",
    )
    upstream_api_key: str = Field("", description="Bearer key the upstream wants; empty: none.")
    upstream_model: str = Field(
        "", description="Model name sent to the upstream; empty: the worker's LLMQ_MODEL."
    )
    upstream_slots: int = Field(
        0,
        ge=0,
        le=10_000,
        description="Sequences the upstream runs at once, the worker's concurrency cap (with "
        "LLMQ_UPSTREAM_QUEUE); 0: the upstream's own count (llama.cpp /props total_slots), "
        "else LLMQ_CONCURRENCY.",
    )
    upstream_queue: int = Field(
        0,
        ge=0,
        le=10_000,
        description="Requests the worker keeps waiting in the upstream's own queue beyond "
        "its slots, so that the engine starts the next sequence the step one ends (its cap "
        "is then slots + this); they are no longer reordered by priority, and each waits "
        "there for a slot within LLMQ_UPSTREAM_TIMEOUT_SECONDS. 0: the cap is the slots.",
    )
    upstream_engine: Literal["auto", "generic", "vllm", "llamacpp", "sglang", "tgi", "ollama"] = (
        Field(
            "auto",
            description="The upstream's kind, for what plain OpenAI does not say: its "
            "tokenize and context-length endpoints, how it continues a chat's last message, "
            "how its chunks are counted. auto: identified at connect from what it serves "
            "(generic, with a log line, where nothing matches).",
        )
    )
    upstream_api: Literal["auto", "completions", "chat"] = Field(
        "auto",
        description="How chat requests reach the upstream: its /v1/chat/completions with the "
        "messages themselves (chat: the model's chat template), or its /v1/completions with "
        "llmq's plain rendering of them (completions). auto: chat wherever the engine has a "
        "chat template, else completions, with a log line.",
    )
    upstream_capabilities: str | None = Field(
        None,
        description="Comma-separated capabilities the upstream honours (logprobs, "
        "json_object, json_schema, tools, ignore_eos, min_tokens); passed through to it. "
        "Unset: what the engine says (llama.cpp: tools where its chat template takes "
        "them); set, even empty: exactly these.",
    )
    upstream_context_length: int = Field(
        0,
        ge=0,
        description="The upstream's context length in tokens; 0: ask it (vLLM max_model_len, "
        "llama.cpp n_ctx per slot), else LLMQ_MAX_PROMPT_TOKENS.",
    )
    upstream_timeout_seconds: float = Field(
        30.0,
        gt=0,
        description="Longest wait for the upstream's next byte (connect, first token, any "
        "token) before the attempt counts as failed and is retried elsewhere.",
    )
    upstream_probe_seconds: float = Field(
        1.0,
        gt=0,
        description="How often the worker checks that its upstream answers; one that does "
        "not stops the worker claiming and hands its running requests back.",
    )

    @model_validator(mode="after")
    def _lease_outlives_heartbeat(self) -> WorkerSettings:
        # A stall or restart of Redis costs a lease up to the lease clock's cap (0.3 s).
        if self.lease_seconds <= self.heartbeat_seconds + 0.3:
            raise ValueError("lease_seconds must exceed heartbeat_seconds by more than 0.3")
        if self.lease_seconds - self.lease_margin_seconds <= self.heartbeat_seconds:
            raise ValueError("lease_seconds - lease_margin_seconds must exceed heartbeat_seconds")
        return self


def parse_bounds(text: str) -> tuple[int, int] | None:
    """``"MIN:MAX"`` -> ``(min, max)``; empty -> None (no autoscaling)."""
    if not text:
        return None
    low, sep, high = text.partition(":")
    try:
        bounds = (int(low), int(high))
    except ValueError:
        bounds = (-1, -1)
    if not sep or not 0 <= bounds[0] <= bounds[1] or bounds[1] < 1 or bounds[1] > 64:
        raise ValueError(f"expected MIN:MAX with 0 <= MIN <= MAX, 1 <= MAX <= 64; got {text!r}")
    return bounds


class ControllerSettings(CommonSettings):
    """The autoscaler's control law and leader lease (``llmq autoscale``, ``llmq run``)."""

    autoscale: str = Field(
        "",
        description="MIN:MAX workers per model, e.g. 1:6 (0:N scales to zero); "
        "empty: no autoscaling (llmq run).",
    )
    slo_ttft_ms: float = Field(
        2000.0, gt=0, description="Time-to-first-token objective the autoscaler keeps (p90)."
    )
    slo_tpot_ms: float = Field(
        100.0, gt=0, description="Time-per-output-token objective the autoscaler keeps (p90)."
    )
    scale_interval_seconds: float = Field(
        1.0, gt=0, le=60, description="Control period of the autoscaler."
    )
    scale_down_window_seconds: float = Field(
        30.0,
        ge=0,
        description="Scale-down stabilization: the target falls only to the highest "
        "desired count of this window, one worker at a time.",
    )
    scale_to_zero_seconds: float = Field(
        60.0, gt=0, description="Idle time (nothing queued or running) before 1 -> 0."
    )
    scale_headroom: float = Field(
        0.2, ge=0, le=5, description="Spare capacity ordered above the measured load (0.2: 20%)."
    )
    scale_dead_band: float = Field(
        0.15,
        ge=0,
        le=5,
        description="Dead band below the headroom: the load term scales up only when the "
        "load plus (headroom - dead band) exceeds what is ordered.",
    )
    worker_startup_seconds: float = Field(
        5.0,
        ge=0,
        description="Expected time from ordering a worker to its first claim, until a "
        "start has been measured.",
    )
    autoscaler_lease_seconds: float = Field(
        3.0, gt=0, description="Leader lease of the autoscaler (one acts at a time)."
    )

    @model_validator(mode="after")
    def _valid_autoscale(self) -> ControllerSettings:
        parse_bounds(self.autoscale)
        if self.autoscaler_lease_seconds <= self.scale_interval_seconds:
            raise ValueError("autoscaler_lease_seconds must be longer than scale_interval_seconds")
        return self

    @property
    def bounds(self) -> tuple[int, int] | None:
        return parse_bounds(self.autoscale)


class AutoscaleSettings(ControllerSettings):
    """Settings of ``llmq autoscale``: a controller that publishes, for an external driver."""

    autoscale: str = Field("1:8", description="MIN:MAX workers per model.")
    models: str = Field("mock", min_length=1, description="Comma-separated models to scale.")
    concurrency: int = Field(
        8, ge=1, le=10_000, description="Requests one worker runs at once (until measured)."
    )


class RunSettings(ControllerSettings):
    """Settings of ``llmq run``: the whole stack as local processes."""

    workers: int = Field(2, ge=0, le=64, description="Worker processes started by llmq run.")
    upstreams: str = Field(
        "",
        description="Comma-separated URLs of inference servers (--upstream URL, repeated): "
        "one worker per server, backend openai, instead of the mock's workers.",
    )
    concurrency: int = Field(8, ge=1, le=10_000)
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    embedded_redis: bool | None = Field(
        None,
        description="Start a private Redis; default: only when LLMQ_REDIS_URL is unset.",
    )
    model: str = Field("mock", min_length=1, max_length=128, description="Model the workers serve.")
    api_processes: int = _api_processes()
    restart_limit: int = Field(
        5,
        ge=1,
        description="Restarts of one child within the restart window that make a crash loop.",
    )
    restart_window_seconds: float = Field(
        60.0, gt=0, description="Window in which restart_limit restarts stop the stack."
    )
    restart_backoff_seconds: float = Field(
        0.5, gt=0, description="First restart delay; doubles with each recent restart (max 10 s)."
    )

    @property
    def upstream_urls(self) -> list[str]:
        return [url.strip() for url in self.upstreams.split(",") if url.strip()]

    @model_validator(mode="after")
    def _one_worker_per_upstream(self) -> RunSettings:
        if self.upstreams and self.bounds is not None:
            raise ValueError("upstreams: one worker per server, not autoscaled")
        return self
