"""The campaign's tenants, and what the checker reads of their quotas and tokens.

Three tenants of equal weight share the pool under fair share (``vtc``, the
default), each with a quota:

- ``flood`` asks far above its share (Poisson arrivals, several a second) and hits
  its quota (requests at once, requests per minute): its 429s are expected, each
  must carry ``retry-after``;
- ``bursty`` sends a burst of several requests at once every few seconds;
- ``steady`` sends Poisson arrivals, as the clients always did.

``bursty`` and ``steady`` ask less than their share, so none of their requests may
wait long (the checker's ``wait``). The batches are the default tenant's. At the end
:func:`quotas` reads every tenant's quota state (reservations and requests at once
left: both must be 0) and :func:`tokens` its ``llmq_tenant_tokens_total`` from the
metric's store in Redis, as ``llmq tenant stats`` reads it (``cli/tenants.py``).
"""

from __future__ import annotations

from typing import Any, cast

from redis.asyncio import Redis

from llmq import metrics
from llmq.metrics import field as metric_field
from llmq.protocol import keys
from llmq.tenants import Tenant, TenantStore, text

FLOOD, BURSTY, STEADY = "flood", "bursty", "steady"
#: The tenant of the batches (and of requests that name none).
DEFAULT = "default"

TENANTS = (
    Tenant(name=FLOOD, max_concurrent=6, requests_per_minute=120),
    Tenant(name=BURSTY, max_concurrent=24, tokens_per_minute=120_000),
    Tenant(name=STEADY, max_concurrent=24, tokens_per_minute=120_000),
)
#: The tenants that ask less than their share.
BELOW_SHARE = (BURSTY, STEADY)


async def create(redis: Redis, tenants: tuple[Tenant, ...] = TENANTS) -> None:
    store = TenantStore(redis)
    for tenant in tenants:
        await store.put(tenant)


async def quotas(redis: Redis, names: list[str]) -> dict[str, dict[str, int]]:
    """Per tenant: its reservations (``reserved``) and places among its requests at once
    (``inflight``) still held."""
    out = {}
    for name in names:
        _, _, inflight, reserved = keys.quota_keys(name)
        out[name] = {
            "reserved": int(await cast("Any", redis.hlen(reserved))),
            "inflight": int(await cast("Any", redis.zcard(inflight))),
        }
    return out


async def tokens(redis: Redis, names: list[str]) -> dict[str, float]:
    """Per tenant: ``llmq_tenant_tokens_total`` as every process has flushed it."""
    store = keys.metric(metrics.TENANT_TOKENS.name)
    out = {}
    for name in names:
        raw = await cast("Any", redis.hget(store, metric_field("", (name,))))
        out[name] = float(text(raw)) if raw is not None else 0.0
    return out
