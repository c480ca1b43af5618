"""The model behind a worker, chosen by ``LLMQ_BACKEND`` in one factory.

``mock`` is the mock model (:mod:`worker.mock`); ``openai`` an OpenAI-compatible
inference server beside the worker (:mod:`worker.backends.openai`), its engine's
extras in :mod:`worker.backends.engines`, its health watched by
:mod:`worker.backends.watch`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from llmq.connection import Outage
from llmq.model.interface import CAPABILITIES, Model
from llmq.settings import WorkerSettings
from worker.backends.engines import ENGINES
from worker.backends.openai import OpenAIUpstream, UpstreamDown
from worker.mock import MockModel

log = logging.getLogger(__name__)


def mock_model(settings: WorkerSettings) -> MockModel:
    return MockModel(
        tokens_per_second=settings.model_tokens_per_second,
        prefill_seconds_per_token=settings.model_prefill_seconds_per_token,
        stop_probability=settings.model_stop_probability,
    )


def upstream_capabilities(text: str) -> frozenset[str]:
    """``LLMQ_UPSTREAM_CAPABILITIES`` as a set; an unknown name is a settings error."""
    names = frozenset(c.strip() for c in text.split(",") if c.strip())
    unknown = names - CAPABILITIES
    if unknown:
        raise ValueError(
            f"LLMQ_UPSTREAM_CAPABILITIES: unknown {', '.join(sorted(unknown))}; "
            f"known: {', '.join(sorted(CAPABILITIES))}"
        )
    if "tools" in names:
        raise ValueError(
            "LLMQ_UPSTREAM_CAPABILITIES: tools need the upstream's chat API, which the "
            "worker does not drive yet (it sends the rendered prompt to /v1/completions)"
        )
    return names


def build_model(settings: WorkerSettings) -> Model:
    """The model the settings name; an upstream is not contacted yet (:func:`connect`)."""
    if settings.backend == "mock":
        return mock_model(settings)
    if not settings.upstream_url:
        raise ValueError("LLMQ_BACKEND=openai needs LLMQ_UPSTREAM_URL")
    # httpx logs every request at INFO: one line per generation, on the hot path
    logging.getLogger("httpx").setLevel(logging.WARNING)
    return OpenAIUpstream(
        settings.upstream_url,
        ENGINES[settings.upstream_engine],
        model=settings.upstream_model or settings.model,
        api_key=settings.upstream_api_key,
        slots=settings.upstream_slots,
        context_length=settings.upstream_context_length,
        capabilities=upstream_capabilities(settings.upstream_capabilities),
        timeout=settings.upstream_timeout_seconds,
        chat=settings.upstream_api == "chat",
    )


async def connect(model: Model, stop: asyncio.Event) -> bool:
    """Wait until an upstream answers what it serves (False if stopped meanwhile);
    the mock is ready at once. The worker registers only after this."""
    if not isinstance(model, OpenAIUpstream):
        return True
    outage = Outage(
        log,
        lost="upstream not answering yet (%s); retrying",
        back="upstream answered after %d failed attempts",
    )
    while not stop.is_set():
        try:
            await model.connect()
        except UpstreamDown as exc:
            await outage.failed(exc)
            continue
        outage.recovered()
        log.info(
            "upstream %s serves %r: %s slots, context %s tokens",
            model.url,
            model.model,
            model.slots or "unknown",
            model.context_length or "unknown",
        )
        return True
    return False


def concurrency(model: Model, settings: WorkerSettings) -> int:
    """The worker's cap: the upstream's slots where known, else ``LLMQ_CONCURRENCY``."""
    slots = getattr(model, "slots", None)
    return int(slots) if slots else settings.concurrency


async def close(model: Model) -> None:
    if isinstance(model, OpenAIUpstream):
        with contextlib.suppress(Exception):
            await model.aclose()
