"""Admission: validate a generation request against the limits and enqueue it.

Everything that can refuse a request is checked before anything is written, and
the write itself is one Lua script (queue bound, job, record, wake-up), so a
refused request leaves no job, key or queue entry behind.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from api.errors import InvalidRequest, NotFound, Overloaded, Unavailable
from api.schemas import GenerationParams
from api.state import AppState
from llmq import keys
from llmq.queue import effective_score, serialize_job
from llmq.schema import JobPayload, RequestRecord, SamplingParams
from worker.model import count_tokens


@dataclass(frozen=True)
class Submitted:
    id: str
    model: str
    created: int
    prompt_tokens: int
    max_tokens: int


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
) -> Submitted:
    """Validate and enqueue; raise an :class:`~api.errors.ApiError` to refuse."""
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
    if not await state.catalog.is_served(params.model):
        if not await state.catalog.models():
            raise Unavailable(
                "no worker is running; retry when one is up",
                code="no_workers",
                headers={"Retry-After": "1"},
            )
        raise NotFound(
            f"the model '{params.model}' does not exist or no worker serves it",
            param="model",
            code="model_not_found",
        )
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
    )
    record = RequestRecord(
        id=rid,
        model=params.model,
        status="queued",
        priority=params.priority,
        created_at=now,
        prompt_tokens=prompt_tokens,
    )
    fields = [x for kv in record.to_redis().items() for x in kv]
    accepted = await state.enqueue(
        keys=[keys.queue(params.model), keys.job(rid), keys.request(rid)],
        args=[
            rid,
            effective_score(now_ms, params.priority, settings.priority_step_ms),
            serialize_job(payload.model_dump(mode="json"), now_ms),
            settings.request_ttl_seconds * 1000,
            settings.max_queue_depth,
            keys.wake(params.model),
            *fields,
        ],
    )
    if not accepted:
        raise Overloaded(
            f"the queue of model '{params.model}' is full ({settings.max_queue_depth} waiting); "
            "retry later",
            code="queue_full",
            headers={"Retry-After": "1"},
        )
    return Submitted(rid, params.model, int(now), prompt_tokens, tokens)
