"""What the admin API shows of the pool: its models, workers and queues, read on demand.

Read-only, and only when an operator asks: nothing on the request path keeps these
figures, so a pool nobody watches pays nothing for them. Every read is bounded: a
queue's breakdown counts at most :data:`COUNT_MAX` of its requests and says so.
"""

from __future__ import annotations

from typing import Any, cast

from api.state import AppState
from llmq.protocol import keys
from llmq.protocol.depth import queued_by
from llmq.protocol.routing import UNMEASURED, Pace, paces
from llmq.schema import WorkerInfo
from llmq.tenants import text

#: The most queued requests of one model whose payloads a breakdown reads.
COUNT_MAX = 1_000


def _worker(w: WorkerInfo, pace: Pace = UNMEASURED) -> dict[str, Any]:
    queries = w.prefix_cache_queries
    return {
        "id": w.id,
        "host": w.host,
        "pid": w.pid,
        "model": w.model,
        "engine": str((w.upstream or {}).get("engine") or "mock"),
        "slots": w.concurrency,
        "used": w.running,
        "free": max(0, w.concurrency - w.running),
        "cache_hit_rate": round(w.prefix_cache_hits / queries, 4) if queries else None,
        "kv_cache_usage": w.kv_cache_usage,
        # how long a run holds a slot, how long a prompt's uncached KV block takes:
        # measured by the worker, published with its routing beats (None until then)
        "pace": {"service_ms": pace.service_ms or None, "block_us": pace.block_us or None},
        "ready": w.ready,
        "draining": w.draining,
        "started_at": w.started_at,
        "heartbeat_at": w.heartbeat_at,
    }


async def models(state: AppState, workers: list[WorkerInfo] | None = None) -> list[str]:
    """Every model a live worker serves or a request was queued for, sorted."""
    live = workers if workers is not None else await state.catalog.workers()
    queued = cast(set[Any], await cast("Any", state.redis.smembers(keys.MODELS)))
    return sorted({w.model for w in live} | {text(m) for m in queued})


async def pool(state: AppState) -> dict[str, Any]:
    """Each model's workers and slots, and each live worker."""
    workers = await state.catalog.workers()
    out = []
    pace: dict[str, Pace] = {}
    for model in await models(state, workers):
        mine = [w for w in workers if w.model == model]
        ids = [w.id for w in mine]
        pace.update(zip(ids, await paces(state.redis, model, ids), strict=True))
        out.append(
            {
                "model": model,
                "workers": len(mine),
                "slots": sum(w.concurrency for w in mine),
                "used": sum(w.running for w in mine),
                "queued": int(await state.redis.zcard(keys.queue(model))),
            }
        )
    return {
        "object": "pool",
        "models": out,
        "workers": [_worker(w, pace.get(w.id, UNMEASURED)) for w in workers],
    }


async def queue(state: AppState) -> dict[str, Any]:
    """Each model's queue: its depth, running, held for a busy prefix holder, and its
    first :data:`COUNT_MAX` queued requests by priority and by tenant."""
    out = []
    for model in await models(state):
        depth = int(await state.redis.zcard(keys.queue(model)))
        found = await queued_by(state.redis, model, COUNT_MAX)
        out.append(
            {
                "model": model,
                "depth": depth,
                "running": int(await state.redis.zcard(keys.running(model))),
                "held": int(await cast("Any", state.redis.hlen(keys.held(model)))),
                "by_priority": {str(p): n for p, n in sorted(found.priority.items())},
                "by_tenant": dict(sorted(found.tenant.items(), key=lambda t: -t[1])),
                "batch": found.batch,
                "counted": found.counted,
            }
        )
    return {"object": "queue", "models": out}
