"""Liveness, readiness and the worker list."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from api.admission.auth import Caller
from api.errors import error_response
from api.openapi import error_responses
from api.state import State
from llmq.autoscale.state import autoscaled

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is alive; says nothing about Redis or workers."""
    return {"status": "ok"}


@router.get("/readyz", response_model=None, responses=error_responses(503))
async def readyz(state: State) -> dict[str, Any] | JSONResponse:
    """Ready: Redis answers and at least one worker is alive with a model that answers
    (``ready``; a worker whose upstream is down stays listed, not ready), or an
    autoscaler serves a model (scaled to zero, its first request starts a worker)."""
    if state.draining.is_set():
        return error_response(
            503, "this API process is stopping", "service_unavailable", code="shutting_down"
        )
    try:
        await state.redis.ping()
        workers = await state.catalog.workers()
        scaled = [] if workers else sorted(await autoscaled(state.redis))
    except Exception as exc:
        return error_response(
            503, f"Redis is unreachable: {exc}", "service_unavailable", code="redis_unavailable"
        )
    if scaled:
        return {"status": "ready", "workers": 0, "autoscaled": scaled}
    if not workers:
        return error_response(503, "no live worker", "service_unavailable", code="no_workers")
    ready = [w for w in workers if w.ready]
    if not ready:
        # alive, but none of their models (inference servers) answers
        return error_response(
            503, "no worker's model answers", "service_unavailable", code="no_ready_workers"
        )
    return {"status": "ready", "workers": len(ready), "unready": len(workers) - len(ready)}


@router.get("/v1/workers", responses=error_responses(401))
async def workers(state: State, _: Caller) -> dict[str, Any]:
    """Live workers from the registry: id, host, pid, model, cap, running."""
    listed = await state.catalog.workers()
    return {"object": "list", "data": [w.model_dump() for w in listed]}
