"""Flow control at admission: a tenant's priority ceiling, its quota, and shedding by
expected wait; each refuses before anything of the request is queued.

- **Quota** (:mod:`llmq.protocol.quota`): a request takes one request from its
  tenant's requests per minute, prompt + max_tokens from its tokens per minute and a
  place among its requests at once, all in one script shared by every API process;
  taken with the request's record, before it is queued (:meth:`Queue.admit
  <llmq.protocol.queue.Queue.admit>`, on a single Redis in the same round trip);
  refused, it gets OpenAI's ``429 rate_limit_exceeded`` with the ``x-ratelimit-*``
  headers and ``retry-after``. What the request does not use comes back when it ends.
- **Shedding** (``LLMQ_SHED_WAIT_SECONDS``): the expected wait is what is queued
  ahead of the request (at or below its queue score) divided by the pool's measured
  service rate (requests finished in the last :data:`RATE_PERIODS` periods and the
  current one so far, :func:`llmq.protocol.keys.served`); over the bound (the setting,
  or the request's own queue timeout when shorter) it gets 429 ``wait_too_long`` with
  ``Retry-After`` from the estimate. Without a measured rate (nothing finished lately)
  nothing is shed.
"""

from __future__ import annotations

import math
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.admission.admission import Admission, kept
from api.errors import InvalidRequest, Overloaded
from llmq import metrics, tracing
from llmq.protocol import keys
from llmq.protocol.queue import Enqueue
from llmq.protocol.quota import Limits, Verdict, take_slots
from llmq.protocol.slots import QuotaTake
from llmq.tenants import Tenant

#: How many completed periods of :func:`llmq.protocol.keys.served` measure the rate.
RATE_PERIODS = 3

#: Beyond the longest a request can live, how long its place at once is held if
#: nothing returns it.
HOLD_MARGIN_MS = 60_000


class RateLimitHeaders:
    """A pure ASGI middleware: a response to a request that took its tenant's quota
    carries OpenAI's ``x-ratelimit-*`` headers (what is left after it), as a 429 does:
    those its :class:`~api.admission.admission.Admission` holds."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope.setdefault("state", {})  # shared with the request's state below

        async def with_headers(message: Message) -> None:
            admission = kept(scope)
            if message["type"] == "http.response.start" and admission and admission.rate_headers:
                extra = [(k.encode(), v.encode()) for k, v in admission.rate_headers.items()]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, with_headers)


def duration(ms: int) -> str:
    """A duration as OpenAI's headers write it: ``12ms``, ``1.5s``, ``6m0s``."""
    if ms < 1000:
        return f"{max(ms, 0)}ms"
    minutes, seconds = divmod(ms / 1000, 60)
    text = f"{round(seconds, 3):g}s"
    return f"{int(minutes)}m{text}" if minutes else text


def rate_headers(v: Verdict) -> dict[str, str]:
    """OpenAI's rate-limit headers of a take (the limits a tenant has)."""
    out: dict[str, str] = {}
    if v.limit_requests:
        out["x-ratelimit-limit-requests"] = str(v.limit_requests)
        out["x-ratelimit-remaining-requests"] = str(v.remaining_requests)
        out["x-ratelimit-reset-requests"] = duration(v.reset_requests_ms)
    if v.limit_tokens:
        out["x-ratelimit-limit-tokens"] = str(v.limit_tokens)
        out["x-ratelimit-remaining-tokens"] = str(v.remaining_tokens)
        out["x-ratelimit-reset-tokens"] = duration(v.reset_tokens_ms)
    return out


async def count(admission: Admission, outcome: str) -> None:
    """One request's outcome at admission, in ``llmq_tenant_requests_total``."""
    state, tenant = admission.state, admission.tenant
    if tenant is not None:
        label = await state.tenancy.labels.label(tenant.name)
        state.metrics.inc(metrics.TENANT_REQUESTS, label, outcome)


def check_priority_ceiling(admission: Admission, priority: int) -> None:
    """400 for a priority more urgent than the tenant may ask for."""
    tenant = admission.tenant
    if tenant is not None and tenant.min_priority is not None and priority < tenant.min_priority:
        raise InvalidRequest(
            f"priority {priority} is more urgent than tenant '{tenant.name}' may ask for "
            f"(at least {tenant.min_priority}; lower runs earlier)",
            param="priority",
            code="priority_not_allowed",
        )


def _limits(tenant: Tenant) -> Limits:
    return Limits(tenant.tokens_per_minute, tenant.requests_per_minute, tenant.max_concurrent)


def quota_take(admission: Admission, calls: list[Enqueue]) -> QuotaTake | None:
    """The take of the tenant's quota for ``calls``, which :meth:`Queue.admit
    <llmq.protocol.queue.Queue.admit>` makes with their records (None: the tenant has no
    limits); 400 ``tokens_over_limit`` for a request no minute of its tenant could hold."""
    tenant = admission.tenant
    if tenant is None or not tenant.limited:
        return None
    limits = _limits(tenant)
    tokens = sum(c.cost for c in calls)
    if limits.tokens_per_minute and tokens > limits.tokens_per_minute:
        raise InvalidRequest(
            f"the request asks for {tokens} tokens (prompt + max_tokens), more than tenant "
            f"'{tenant.name}' may use in a minute ({limits.tokens_per_minute})",
            param="max_tokens",
            code="tokens_over_limit",
        )
    hold_ms = max(c.deadline_ms for c in calls) - int(time.time() * 1000)
    timeout_s = admission.policy(calls[0].model).generation_timeout_seconds
    hold_ms += int(timeout_s * 1000) + HOLD_MARGIN_MS
    return take_slots(tenant.name, limits, hold_ms, [(c.request_id, c.cost) for c in calls])


async def check_quota(admission: Admission, tenant: Tenant, verdict: Verdict) -> None:
    """The response's rate-limit headers of a take; 429 ``rate_limit_exceeded`` (nothing
    was queued) if the quota was spent."""
    admission.quota = verdict
    if verdict.taken:
        admission.rate_headers = rate_headers(verdict)
        return
    limits = _limits(tenant)
    limit = {
        "requests": f"{limits.requests_per_minute} requests per minute",
        "tokens": f"{limits.tokens_per_minute} tokens per minute",
        "concurrent": f"{limits.max_concurrent} requests at once",
    }[verdict.which]
    await count(admission, "rate_limited")
    headers = rate_headers(verdict)
    headers["Retry-After"] = str(max(1, math.ceil(verdict.retry_ms / 1000)))
    headers["retry-after-ms"] = str(max(verdict.retry_ms, 1))
    raise Overloaded(
        f"rate limit reached for tenant '{tenant.name}': {limit}; retry in "
        f"{duration(verdict.retry_ms)}",
        code="rate_limit_exceeded",
        headers=headers,
    )


async def give_back_refused(admission: Admission, calls: list[Enqueue]) -> None:
    """Return the quota of requests the queue then refused (all of it)."""
    tenant = admission.tenant
    if tenant is None or not tenant.limited:
        return
    for c in calls:
        await admission.state.queue.quota.give_back(tenant.name, c.request_id, 0)


async def shed(admission: Admission, calls: list[Enqueue]) -> None:
    """429 ``wait_too_long`` if the expected queue wait exceeds the bound."""
    first = calls[0]
    bound_s = admission.policy(first.model).shed_wait_seconds
    if not bound_s:
        return
    bound_ms = min(bound_s * 1000, first.deadline_ms - time.time() * 1000)
    ahead, finished = await admission.state.queue.backlog(first.model, first.score, RATE_PERIODS)
    if not finished or not ahead:
        return
    # the completed periods and the current one so far: requests per second
    now = time.time()
    rate = finished / (RATE_PERIODS * keys.SERVED_PERIOD_SECONDS + now % keys.SERVED_PERIOD_SECONDS)
    wait_ms = ahead / rate * 1000
    admission.expected_wait_ms = wait_ms
    if (span := tracing.current()) is not None:
        span.set_attribute("llmq.shed.expected_wait_ms", round(wait_ms, 3))
        span.set_attribute("llmq.shed.bound_ms", round(bound_ms, 3))
    if wait_ms <= bound_ms:
        return
    await count(admission, "shed")
    retry_s = max(1, math.ceil((wait_ms - bound_ms) / 1000))
    raise Overloaded(
        f"the expected wait in the queue of model '{first.model}' is {wait_ms / 1000:.1f} s, "
        f"over the bound of {bound_ms / 1000:g} s; retry later",
        code="wait_too_long",
        headers={"Retry-After": str(retry_s)},
    )
