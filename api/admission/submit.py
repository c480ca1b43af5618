"""Admission: validate a generation request against the limits and enqueue it.

Everything that can refuse a request is checked before anything is written; the
write is one call of the protocol (:class:`llmq.protocol.queue.Enqueue` builds what
is written, :meth:`llmq.protocol.queue.Queue.admit` writes it: the request's record,
then one Lua script in its model's slot for the queue bound, job, wake-up or
hand-off), and a request the queue refuses has its record deleted again, so it
leaves no job, key or queue entry behind. A request with several choices (``n``, a
prompt list) becomes one queued request per choice, admitted all or none. Each step
reads and records through the request's :class:`~api.admission.admission.Admission`.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

from opentelemetry.trace import Span

from api.admission.admission import Admission, BatchBand
from api.admission.flow import (
    check_priority_ceiling,
    check_quota,
    count,
    give_back_refused,
    quota_take,
    shed,
)
from api.bodies import EmbeddingRequest, GenerationParams
from api.catalog import Declaration
from api.errors import InvalidRequest, NotFound, Overloaded, Unavailable, Unsupported
from api.extras import Extras
from api.state import AppState
from llmq import metrics, replication, tracing
from llmq.autoscale.state import serves as autoscaler_serves
from llmq.policy.model import Policy
from llmq.protocol.queue import Enqueue, batch_score
from llmq.schema import EmbedTask, JobPayload, SamplingParams

log = logging.getLogger(__name__)

NO_EXTRAS = Extras()


@dataclass(frozen=True)
class Submitted:
    id: str
    model: str
    created: int
    prompt_tokens: int
    max_tokens: int
    queue_deadline: float
    #: The choice's index in the response, and its prompt's in the request.
    index: int = 0
    prompt_index: int = 0


def _timeout(requested: float | None, limit: float, param: str) -> float:
    if requested is None:
        return limit
    if requested > limit:
        raise InvalidRequest(
            f"{param} must be at most {limit:g} seconds", param=param, code="invalid_value"
        )
    return requested


def _check_priority(policy: Policy, priority: int) -> None:
    low, high = policy.min_priority, policy.max_priority
    if not low <= priority <= high:
        raise InvalidRequest(
            f"priority must be between {low} and {high}", param="priority", code="invalid_value"
        )


async def _check_model(admission: Admission, model: str) -> None:
    state = admission.state
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


def _max_tokens(policy: Policy, requested: int | None, param: str, room: int | None) -> int:
    """The request's ``max_tokens``; unset: what the context leaves after the longest
    prompt (``room``; None: the workers declare no context, and the limit applies),
    as vLLM and OpenAI do, bounded by ``LLMQ_DEFAULT_MAX_TOKENS`` where set."""
    limit = policy.max_tokens_limit
    if requested is None:
        tokens = limit if room is None else max(1, room)
        cap = policy.default_max_tokens
        return min(tokens, cap) if cap else tokens
    if requested > limit:
        raise InvalidRequest(
            f"{param} must be at most {limit}, got {requested}", param=param, code="invalid_value"
        )
    return requested


@dataclass(frozen=True)
class _Choice:
    prompt: str
    prompt_tokens: int
    index: int
    prompt_index: int
    #: The tokens routing names blocks of, where not ``prompt``'s: the engine's rendering.
    rendered: tuple[str, ...] | None = None


def _plan(
    admission: Admission,
    params: GenerationParams,
    choice: _Choice,
    common: _Common,
    *,
    now: float,
    messages: tuple[dict[str, Any], ...] | None,
    trace: dict[str, str] | None,
) -> tuple[Enqueue, Submitted]:
    """The job, record and queue entry of one choice, and what the route needs of it."""
    state, tenant, band = admission.state, admission.tenant, admission.band
    policy = admission.policy(params.model)
    rid = uuid.uuid4().hex
    seed = None if params.seed is None else params.seed + choice.index
    payload = JobPayload(
        request_id=rid,
        model=params.model,
        prompt=choice.prompt,
        prompt_tokens=choice.prompt_tokens,
        params=common.sampling.model_copy(update={"seed": seed}),
        priority=common.priority,
        enqueued_at=now,
        queue_deadline=now + common.queue_timeout,
        generation_timeout=common.generation_timeout,
        messages=messages,
        batch=None if band is None else band.batch_id,
        tenant=None if tenant is None else tenant.name,
        trace=trace,
    )
    call = Enqueue.of(
        payload,
        priority_step_ms=policy.priority_step_ms,
        owner=admission.owner,
        attach_to=state.process_id if admission.attach else None,
        route=state.queue.routing_for(params.model).hint(
            choice.prompt,
            common.priority,
            admission.session or params.user,
            tokens=choice.rendered,
        ),
        weight=1.0 if tenant is None else tenant.weight,
        reserved=tenant is not None and tenant.limited,
    )
    if band is not None:
        call = replace(call, score=batch_score(int(now * 1000)))
    sub = Submitted(
        rid,
        params.model,
        int(now),
        choice.prompt_tokens,
        common.tokens,
        payload.queue_deadline,
        index=choice.index,
        prompt_index=choice.prompt_index,
    )
    return call, sub


async def _check_capabilities(admission: Admission, model: str, sampling: SamplingParams) -> None:
    if sampling.min_tokens > sampling.max_tokens:
        raise InvalidRequest(
            f"min_tokens ({sampling.min_tokens}) must not exceed max_tokens "
            f"({sampling.max_tokens})",
            param="min_tokens",
            code="invalid_value",
        )
    await _check_declared(admission, model, sampling.required_capabilities())


async def _check_declared(admission: Admission, model: str, needed: list[tuple[str, str]]) -> None:
    """Refuse what the model's live workers do not declare (each with its parameter)."""
    if not needed:
        return
    declared = await admission.state.catalog.capabilities(model)
    if declared is None:
        return  # no live worker yet (an accepted model): its worker refuses what it lacks
    for capability, param in needed:
        if capability not in declared:
            raise Unsupported(
                f"the model '{model}' does not support {param} ({capability})", param=param
            )


@dataclass(frozen=True)
class _Common:
    """What every choice of one request shares, validated once."""

    tokens: int
    #: The sampling parameters of every choice but its seed.
    sampling: SamplingParams
    queue_timeout: float
    generation_timeout: float
    priority: int


async def _validate(
    admission: Admission,
    params: GenerationParams,
    *,
    max_tokens: int | None,
    max_tokens_param: str,
    extras: Extras,
    room: int | None,
) -> _Common:
    policy = admission.policy(params.model)
    tokens = _max_tokens(policy, max_tokens, max_tokens_param, room)
    priority = params.priority or 0
    _check_priority(policy, priority)
    sampling = SamplingParams(
        max_tokens=tokens,
        temperature=1.0 if params.temperature is None else params.temperature,
        top_p=1.0 if params.top_p is None else params.top_p,
        stop=params.stop_sequences(),
        ignore_eos=bool(params.ignore_eos),
        min_tokens=params.min_tokens or 0,
        logprobs=extras.logprobs,
        response_format=extras.response_format,
        tools=extras.tools,
        tool_choice=extras.tool_choice,
        after_tool_result=extras.after_tool_result,
    )
    common = _Common(
        tokens=tokens,
        sampling=sampling,
        queue_timeout=_timeout(params.queue_timeout, policy.queue_timeout_seconds, "queue_timeout"),
        generation_timeout=_timeout(
            params.generation_timeout, policy.generation_timeout_seconds, "generation_timeout"
        ),
        priority=priority,
    )
    await _check_model(admission, params.model)
    await _check_capabilities(admission, params.model, sampling)
    return common


def _prompt_tokens(policy: Policy, prompt: str, param: str, declared: Declaration) -> int:
    """Counted with the tokenizer the model's workers declare (an estimate for ``chars``:
    a worker with an upstream counts exactly and refuses what does not fit)."""
    prompt_tokens = declared.tokenizer.count(prompt)
    if prompt_tokens == 0:
        raise InvalidRequest(f"{param} must not be empty", param=param, code="invalid_value")
    # An estimate (a tokenizer other than the mock's words) says so.
    about = "" if declared.tokenizer.name == "whitespace" else "about "
    limit = policy.max_prompt_tokens
    if prompt_tokens > limit:
        raise InvalidRequest(
            f"{param} has {about}{prompt_tokens} tokens, more than the limit of {limit}",
            param=param,
            code="context_length_exceeded",
        )
    context = declared.context_length
    if context is not None and prompt_tokens >= context:
        raise InvalidRequest(
            f"{param} has {about}{prompt_tokens} tokens; the model's context length is "
            f"{context} tokens",
            param=param,
            code="context_length_exceeded",
        )
    return prompt_tokens


def _check_choices(policy: Policy, params: GenerationParams, prompts: int) -> None:
    limit = policy.max_choices
    if prompts * params.choices > limit:
        asked = (
            f"n={params.choices} times {prompts} prompts" if prompts > 1 else f"n={params.choices}"
        )
        raise InvalidRequest(
            f"at most {limit} choices per request ({asked} asks for {prompts * params.choices})",
            param="n" if params.n else "prompt",
            code="invalid_value",
        )


async def submit(
    admission: Admission,
    params: GenerationParams,
    prompt: str,
    *,
    max_tokens: int | None,
    max_tokens_param: str = "max_tokens",
    prompt_param: str = "prompt",
    extras: Extras = NO_EXTRAS,
) -> Submitted:
    """Validate and enqueue one request; raise an :class:`~api.errors.ApiError` to refuse.

    An attached admission (:attr:`~api.admission.admission.Admission.attach`): the
    caller must :meth:`~llmq.protocol.queue.Queue.detach` it once the client is done.
    """
    if params.choices != 1:
        raise InvalidRequest(
            "n must be 1 here: one request is one choice (the OpenAI endpoints take n > 1)",
            param="n",
            code="invalid_value",
        )
    subs = await submit_choices(
        admission,
        params,
        [prompt],
        max_tokens=max_tokens,
        max_tokens_param=max_tokens_param,
        prompt_param=prompt_param,
        extras=extras,
    )
    return subs[0]


async def submit_choices(
    admission: Admission,
    params: GenerationParams,
    prompts: list[str],
    *,
    max_tokens: int | None,
    max_tokens_param: str = "max_tokens",
    prompt_param: str = "prompt",
    extras: Extras = NO_EXTRAS,
    messages: tuple[dict[str, Any], ...] | None = None,
) -> list[Submitted]:
    """Validate and enqueue ``n`` choices per prompt, each its own request: all or none.

    Choice ``k`` of prompt ``p`` has index ``p * n + k`` and, if the request has a
    seed, the seed plus its index (so that the choices differ). Several choices are
    enqueued in one atomic script call that refuses them all (429) unless the
    queue has room for every one. Under a routing policy each carries its route
    hint (:meth:`llmq.protocol.routing.Routing.hint`: its leading KV blocks by the
    ``LLMQ_ROUTING_TOKENIZER``, and its session, else its ``user``). A batch
    line's choices go in the batch band (the admission's ``band``).
    """
    state, band = admission.state, admission.band
    settings = state.settings
    policy = admission.policy(params.model)
    _check_choices(policy, params, len(prompts))
    declared = await state.catalog.declaration(params.model)
    counts = [
        _prompt_tokens(
            policy, p, prompt_param if len(prompts) == 1 else f"{prompt_param}[{i}]", declared
        )
        for i, p in enumerate(prompts)
    ]
    room = None if declared.context_length is None else declared.context_length - max(counts)
    common = await _validate(
        admission,
        params,
        max_tokens=max_tokens,
        max_tokens_param=max_tokens_param,
        extras=extras,
        room=room,
    )
    check_priority_ceiling(admission, common.priority)
    now = time.time()
    if band is not None:
        common = replace(common, queue_timeout=max(band.deadline - now, 0.001))
    rendered = None
    routing = state.queue.routing_for(params.model)
    if messages and routing.routed:
        renderer = await state.catalog.renderer(params.model)
        rendered = await state.rendering.render(renderer, messages, routing.tokenizer)
    n = params.choices
    calls: list[Enqueue] = []
    subs: list[Submitted] = []
    trace = _trace(band)
    for p, (prompt, prompt_tokens) in enumerate(zip(prompts, counts, strict=True)):
        for k in range(n):
            index = p * n + k
            choice = _Choice(prompt, prompt_tokens, index, p, rendered)
            call, sub = _plan(
                admission, params, choice, common, now=now, messages=messages, trace=trace
            )
            calls.append(call)
            subs.append(sub)
    await _admit(admission, calls, [sub.id for sub in subs], trace)
    for sub in subs:
        prompt = prompts[sub.prompt_index]
        log.info(
            "accepted request %s (model %s, priority %d, %d+%d tokens)",
            sub.id,
            params.model,
            common.priority,
            sub.prompt_tokens,
            common.tokens,
            extra={"request_id": sub.id},
        )
        if settings.log_prompts:
            log.info("request %s prompt: %r", sub.id, prompt, extra={"request_id": sub.id})
    return subs


def _trace(band: BatchBand | None) -> dict[str, str] | None:
    """The trace context the jobs carry (None while tracing is off): the request's
    (the client's ``traceparent`` continued, :class:`api.traced.TraceRequests`), or for
    a batch line a trace of its own, rooted in a ``llmq.batch_line`` span that names
    its batch."""
    if band is None or not tracing.enabled():
        return tracing.carrier()
    line = tracing.start_batch_line(band.batch_id)
    if line is None:
        return None
    line.end()
    return tracing.carrier(line)


async def _admit(
    admission: Admission, calls: list[Enqueue], rids: list[str], trace: dict[str, str] | None
) -> None:
    """Enqueue ``calls`` all or none, in a ``llmq.admission`` span while tracing is on
    (a batch line's a child of its ``llmq.batch_line``, whose context is ``trace``);
    429 if the expected wait is too long (:func:`api.admission.flow.shed`), the tenant's quota is
    spent (:func:`api.admission.flow.check_quota`) or the queue has no room for them all."""
    model, tenant, band = calls[0].model, admission.tenant, admission.band
    if not tracing.enabled():
        await _admit_traced(admission, calls, rids, None)
        return
    attributes: dict[str, str | int | list[str]] = {
        "gen_ai.request.model": model,
        "llmq.request.id": rids if len(rids) > 1 else rids[0],
        "llmq.priority": int(calls[0].record.get("priority", "0")),
        "llmq.priority.band": "live" if band is None else "batch",
        "llmq.request.cost_tokens": sum(c.cost for c in calls),
    }
    if tenant is not None:
        attributes["llmq.tenant"] = tenant.name
    if band is not None:
        attributes["llmq.batch.id"] = band.batch_id
    parent = tracing.extract(trace) if band is not None and trace else None
    with tracing.tracer().start_as_current_span(
        "llmq.admission", context=parent, attributes=attributes
    ) as span:
        await _admit_traced(admission, calls, rids, span)


async def _admit_traced(
    admission: Admission, calls: list[Enqueue], rids: list[str], span: Span | None
) -> None:
    state, tenant, model = admission.state, admission.tenant, calls[0].model
    settings = state.settings
    depth = admission.policy(model).max_queue_depth
    await shed(admission, calls)
    take = quota_take(admission, calls)
    try:
        answer = await state.queue.admit(calls, depth, quota=take)
    except BaseException:  # not known to be admitted: its quota goes back (if Redis takes it)
        with contextlib.suppress(Exception):
            await give_back_refused(admission, calls)
        raise
    if span is not None:
        span.set_attribute("llmq.admission.queued", answer.queued)
        if answer.queued:  # its place: requests queued ahead of it (a round trip, traced only)
            ahead = await state.queue.ahead(model, min(c.score for c in calls))
            span.set_attribute("llmq.queue.ahead", ahead)
        if answer.quota is not None:
            span.set_attribute("llmq.quota.taken", answer.quota.taken)
            span.set_attribute("llmq.quota.refused_by", answer.quota.which)
    if answer.quota is not None and tenant is not None:
        await check_quota(admission, tenant, answer.quota)
    if not answer.queued:
        await give_back_refused(admission, calls)
        state.metrics.inc(metrics.REQUESTS, model, "rejected")
        limit = depth
        why = (
            f"is full ({limit} waiting)"
            if len(calls) == 1
            else f"has no room for the {len(calls)} choices of this request (at most {limit} wait)"
        )
        raise Overloaded(
            f"the queue of model '{model}' {why}; retry later",
            code="queue_full",
            headers={"Retry-After": "1"},
        )
    admission.queued = True
    await count(admission, "accepted")
    if settings.enqueue_min_replicas:
        await _replicated(state, rids, model)


async def submit_embedding(
    admission: Admission, body: EmbeddingRequest, texts: list[str]
) -> Submitted:
    """Validate and enqueue an embedding request: one job for all its inputs, which a
    worker that declares ``embeddings`` runs; attached to this process (a live one),
    like an OpenAI generation."""
    state, tenant, band = admission.state, admission.tenant, admission.band
    settings = state.settings
    policy = admission.policy(body.model)
    limit = settings.max_embedding_inputs
    if len(texts) > limit:
        raise InvalidRequest(
            f"at most {limit} inputs per request, got {len(texts)}",
            param="input",
            code="invalid_value",
        )
    if body.dimensions is not None and body.dimensions > settings.max_embedding_dimensions:
        raise InvalidRequest(
            f"dimensions must be at most {settings.max_embedding_dimensions}",
            param="dimensions",
            code="invalid_value",
        )
    declared = await state.catalog.declaration(body.model)
    tokens = sum(
        _prompt_tokens(policy, t, "input" if len(texts) == 1 else f"input[{i}]", declared)
        for i, t in enumerate(texts)
    )
    priority = body.priority or 0
    _check_priority(policy, priority)
    check_priority_ceiling(admission, priority)
    queue_timeout = _timeout(body.queue_timeout, policy.queue_timeout_seconds, "queue_timeout")
    await _check_model(admission, body.model)
    await _check_declared(admission, body.model, [("embeddings", "input")])
    now, rid = time.time(), uuid.uuid4().hex
    if band is not None:
        queue_timeout = max(band.deadline - now, 0.001)
    payload = JobPayload(
        request_id=rid,
        model=body.model,
        prompt="",
        prompt_tokens=tokens,
        params=SamplingParams(max_tokens=1),
        priority=priority,
        enqueued_at=now,
        queue_deadline=now + queue_timeout,
        generation_timeout=policy.generation_timeout_seconds,
        embed=EmbedTask(inputs=tuple(texts), dimensions=body.dimensions, seed=body.seed or 0),
        batch=None if band is None else band.batch_id,
        tenant=None if tenant is None else tenant.name,
        trace=_trace(band),
    )
    call = Enqueue.of(
        payload,
        priority_step_ms=policy.priority_step_ms,
        owner=admission.owner,
        attach_to=state.process_id if band is None else None,
        reserved=tenant is not None and tenant.limited,
    )
    if band is not None:
        call = replace(call, score=batch_score(int(now * 1000)))
    await _admit(admission, [call], [rid], payload.trace)
    log.info(
        "accepted embedding request %s (model %s, %d inputs, %d tokens)",
        rid,
        body.model,
        len(texts),
        tokens,
        extra={"request_id": rid},
    )
    return Submitted(rid, body.model, int(now), tokens, 1, payload.queue_deadline)


async def _replicated(state: AppState, rids: list[str], model: str) -> None:
    """Refuse (and cancel) requests that too few replicas acknowledged in time.

    One wait covers them all: replicas apply writes in order, and the marker that
    is waited for is written after every enqueue of this request.
    """
    settings = state.settings
    if await replication.acknowledged(
        state.redis,
        rids[-1],
        ttl_seconds=state.policy.pool().request_ttl_seconds,
        replicas=settings.enqueue_min_replicas,
        timeout_ms=settings.enqueue_replica_timeout_ms,
    ):
        return
    for rid in rids:
        await state.queue.cancel(model, rid)
    raise Unavailable(
        f"the request was not acknowledged by {settings.enqueue_min_replicas} Redis replica(s) "
        f"within {settings.enqueue_replica_timeout_ms} ms; retry later",
        code="replica_timeout",
        headers={"Retry-After": "1"},
    )
