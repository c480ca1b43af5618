"""A worker's backend (the model object it runs), chosen by ``LLMQ_BACKEND`` in one factory.

``mock`` is the mock model (:mod:`worker.mock`); ``openai`` an OpenAI-compatible
inference server beside the worker (``openai.py``), its engine's extras in
``engines.py``, its health watched by ``watch.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from llmq.model.interface import CAPABILITIES, Backend, Embedder, capabilities_of
from llmq.outage import Outage
from llmq.settings import WorkerSettings
from worker.backends.engines import ENGINES
from worker.backends.openai import OpenAIUpstream, UpstreamDown
from worker.embedding import HashEmbedder
from worker.mock import MockBackend
from worker.mock_engine.profiles import DEFAULT, PROFILES

log = logging.getLogger(__name__)


def mock_backend(settings: WorkerSettings) -> MockBackend:
    """The mock with its profile's figures; the default profile's speeds are the
    settings', and any speed setting given explicitly overrides a named profile's."""
    profile = PROFILES.get(settings.model_profile)
    if profile is None:
        known = ", ".join(PROFILES)
        raise ValueError(f"unknown model_profile {settings.model_profile!r} (known: {known})")
    given = settings.model_fields_set
    figures: dict[str, Any] = {
        "stop_probability": settings.mock_stop_probability(),
        "block_size": settings.model_kv_block_size,
    }
    if profile is DEFAULT or "model_tokens_per_second" in given:
        figures["tokens_per_second"] = settings.model_tokens_per_second
    if profile is DEFAULT or "model_prefill_seconds_per_token" in given:
        figures["prefill_seconds_per_token"] = settings.model_prefill_seconds_per_token
    if settings.model_kv_blocks:
        figures["kv_blocks"] = settings.model_kv_blocks
    if settings.model_step_token_budget:
        figures["step_token_budget"] = settings.model_step_token_budget
    return MockBackend.from_profile(profile, **figures)


def embedder_for(backend: Backend, settings: WorkerSettings) -> Embedder | None:
    """What embeds for ``backend``: its own embedder, else the mock's for the mock."""
    if isinstance(backend, Embedder):
        return backend
    if isinstance(backend, MockBackend) and "embeddings" in capabilities_of(backend):
        return HashEmbedder(dimensions=settings.model_embedding_dimensions)
    return None


def upstream_capabilities(settings: WorkerSettings) -> frozenset[str] | None:
    """``LLMQ_UPSTREAM_CAPABILITIES`` as a set (None: unset, the engine's word is taken
    at :func:`connect`); an unknown name is a settings error."""
    text = settings.upstream_capabilities
    if text is None:
        return None
    names = frozenset(c.strip() for c in text.split(",") if c.strip())
    unknown = names - CAPABILITIES
    if unknown:
        raise ValueError(
            f"LLMQ_UPSTREAM_CAPABILITIES: unknown {', '.join(sorted(unknown))}; "
            f"known: {', '.join(sorted(CAPABILITIES))}"
        )
    if "tools" in names and settings.upstream_api == "completions":
        raise ValueError(
            "LLMQ_UPSTREAM_CAPABILITIES: tools need the upstream's chat API "
            "(LLMQ_UPSTREAM_API=chat); /v1/completions takes no tools"
        )
    return names


def build_backend(settings: WorkerSettings) -> Backend:
    """The backend the settings pick; an upstream is not contacted yet (:func:`connect`)."""
    if settings.backend == "mock":
        return mock_backend(settings)
    if not settings.upstream_url:
        raise ValueError("LLMQ_BACKEND=openai needs LLMQ_UPSTREAM_URL")
    return OpenAIUpstream(
        settings.upstream_url,
        None if settings.upstream_engine == "auto" else ENGINES[settings.upstream_engine],
        model=settings.upstream_model or settings.model,
        api_key=settings.upstream_api_key,
        slots=settings.upstream_slots,
        queued=settings.upstream_queue,
        context_length=settings.upstream_context_length,
        capabilities=upstream_capabilities(settings),
        timeout=settings.upstream_timeout_seconds,
        chat=None if settings.upstream_api == "auto" else settings.upstream_api == "chat",
    )


async def connect(backend: Backend, stop: asyncio.Event) -> bool:
    """Wait until an upstream answers what it serves (False if stopped meanwhile);
    the mock is ready at once. The worker registers only after this."""
    if not isinstance(backend, OpenAIUpstream):
        return True
    outage = Outage(
        log,
        lost="upstream not answering yet (%s); retrying",
        back="upstream answered after %d failed attempts",
    )
    while not stop.is_set():
        try:
            await backend.connect()
        except UpstreamDown as exc:
            await outage.failed(exc)
            continue
        outage.recovered()
        if backend.identified and backend.engine.name == "generic":
            log.warning(
                "upstream %s is none of the engines llmq knows (llama.cpp, vLLM, SGLang, "
                "TGI, Ollama): served as generic, with what the settings give "
                "(LLMQ_UPSTREAM_ENGINE names it)",
                backend.url,
            )
        if backend.identified_chat and not backend.chat:
            log.warning(
                "upstream %s has no chat template: chat requests reach its /v1/completions "
                "as llmq's plain rendering of the messages",
                backend.url,
            )
        log.info(
            "upstream %s (%s, %s) serves %r: %s slots, context %s tokens, capabilities: %s",
            backend.url,
            backend.engine.name,
            "identified" if backend.identified else "set",
            backend.model,
            backend.slots or "unknown",
            backend.context_length or "unknown",
            ", ".join(sorted(backend.capabilities)) or "none",
        )
        return True
    return False


def concurrency(backend: Backend, settings: WorkerSettings) -> int:
    """The worker's cap: the upstream's slots where known (plus the requests it keeps
    queued there, ``LLMQ_UPSTREAM_QUEUE``), else ``LLMQ_CONCURRENCY``."""
    if isinstance(backend, OpenAIUpstream) and backend.slots:
        return backend.slots + backend.queued
    return settings.concurrency


def upstream_found(backend: Backend) -> dict[str, Any] | None:
    """What the worker found of its upstream (None: the mock), for its registry entry."""
    return backend.found() if isinstance(backend, OpenAIUpstream) else None


async def close(backend: Backend) -> None:
    if isinstance(backend, OpenAIUpstream):
        with contextlib.suppress(Exception):
            await backend.aclose()
