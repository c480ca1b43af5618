"""Admission: validate a generation request against the limits and enqueue it.

Everything that can refuse a request is checked before anything is written, and
the write itself is one Lua script (queue bound, job, record, wake-up), so a
refused request leaves no job, key or queue entry behind.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass

from api.errors import InvalidRequest, NotFound, Overloaded, Unavailable
from api.schemas import GenerationParams
from api.state import AppState
from llmq import metrics
from llmq.autoscale.state import serves as autoscaler_serves
from llmq.queue import effective_score, serialize_job
from llmq.schema import JobPayload, Lifecycle, RequestRecord, SamplingParams
from worker.model import count_tokens

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Submitted:
    id: str
    model: str
    created: int
    prompt_tokens: int
    max_tokens: int
    queue_deadline: float


def _timeout(requested: float | None, limit: float, param: str) -> float:
    if requested is None:
        return limit
    if requested > limit:
        raise InvalidRequest(
            f"{param} must be at most {limit:g} seconds", param=param, code="invalid_value"
        )
    return requested


def _check_priority(state: AppState, priority: int) -> None:
    low, high = state.settings.min_priority, state.settings.max_priority
    if not low <= priority <= high:
        raise InvalidRequest(
            f"priority must be between {low} and {high}", param="priority", code="invalid_value"
        )


async def _check_model(state: AppState, model: str) -> None:
    if await state.catalog.is_served(model) or model in state.accept_models:
        return
    if await autoscaler_serves(state.redis, model):  # scaled from zero by the first request
        return
    if not await state.catalog.models():
        raise Unavailable(
            "no worker is running; retry when one is up",
            code="no_workers",
            headers={"Retry-After": "1"},
        )
    raise NotFound(
        f"the model '{model}' does not exist or no worker serves it",
        param="model",
        code="model_not_found",
    )


def _max_tokens(state: AppState, requested: int | None, param: str) -> int:
    limit = state.settings.max_tokens_limit
    if requested is None:
        return min(state.settings.default_max_tokens, limit)
    if requested > limit:
        raise InvalidRequest(
            f"{param} must be at most {limit}, got {requested}", param=param, code="invalid_value"
        )
    return requested


async def submit(
    state: AppState,
    params: GenerationParams,
    prompt: str,
    *,
    max_tokens: int | None,
    max_tokens_param: str = "max_tokens",
    prompt_param: str = "prompt",
    owner: str | None = None,
    attach: bool = False,
) -> Submitted:
    """Validate and enqueue; raise an :class:`~api.errors.ApiError` to refuse.

    ``attach``: the request lives only as long as this API process (its client
    cannot reconnect elsewhere); the caller must :meth:`~llmq.queue.Queue.detach`
    it once the client is done.
    """
    settings = state.settings
    prompt_tokens = count_tokens(prompt)
    if prompt_tokens == 0:
        raise InvalidRequest(
            f"{prompt_param} must not be empty", param=prompt_param, code="invalid_value"
        )
    if prompt_tokens > settings.max_prompt_tokens:
        raise InvalidRequest(
            f"{prompt_param} has {prompt_tokens} tokens, more than the limit of "
            f"{settings.max_prompt_tokens}",
            param=prompt_param,
            code="context_length_exceeded",
        )
    tokens = _max_tokens(state, max_tokens, max_tokens_param)
    _check_priority(state, params.priority)
    queue_timeout = _timeout(params.queue_timeout, settings.queue_timeout_seconds, "queue_timeout")
    generation_timeout = _timeout(
        params.generation_timeout, settings.generation_timeout_seconds, "generation_timeout"
    )
    await _check_model(state, params.model)
    now = time.time()
    now_ms = int(now * 1000)
    rid = uuid.uuid4().hex
    payload = JobPayload(
        request_id=rid,
        model=params.model,
        prompt=prompt,
        prompt_tokens=prompt_tokens,
        params=SamplingParams(
            max_tokens=tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            stop=params.stop_sequences(),
            seed=params.seed,
        ),
        priority=params.priority,
        enqueued_at=now,
        queue_deadline=now + queue_timeout,
        generation_timeout=generation_timeout,
    )
    record = RequestRecord(
        id=rid,
        model=params.model,
        status="queued",
        priority=params.priority,
        created_at=now,
        prompt_tokens=prompt_tokens,
        owner=owner,
    )
    accepted = await state.queue.enqueue(
        rid,
        params.model,
        job=serialize_job(payload.model_dump(mode="json"), now_ms),
        score=effective_score(now_ms, params.priority, settings.priority_step_ms),
        max_depth=settings.max_queue_depth,
        cost=prompt_tokens + tokens,
        deadline_ms=int(payload.queue_deadline * 1000),
        record=record.to_redis(),
        lifecycle=Lifecycle(
            event="queued",
            request_id=rid,
            model=params.model,
            ts=now,
            priority=params.priority,
            prompt_tokens=prompt_tokens,
        ),
        attach_to=state.process_id if attach else None,
    )
    if not accepted:
        state.metrics.inc(metrics.REQUESTS, params.model, "rejected")
        raise Overloaded(
            f"the queue of model '{params.model}' is full ({settings.max_queue_depth} waiting); "
            "retry later",
            code="queue_full",
            headers={"Retry-After": "1"},
        )
    log.info(
        "accepted request %s (model %s, priority %d, %d+%d tokens)",
        rid,
        params.model,
        params.priority,
        prompt_tokens,
        tokens,
        extra={"request_id": rid},
    )
    if settings.log_prompts:
        log.info("request %s prompt: %r", rid, prompt, extra={"request_id": rid})
    return Submitted(rid, params.model, int(now), prompt_tokens, tokens, payload.queue_deadline)
