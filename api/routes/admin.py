"""The admin API's pool: models, workers and queues; draining a worker; the audit trail.

Every route needs an admin key (:mod:`api.admin`); every action writes one audit
entry, after it succeeded (a refused call changes nothing and writes nothing).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Path, Query

from api import pool_view
from api.admin import REFUSALS, AdminCaller, audit
from api.errors import InvalidRequest, NotFound
from api.openapi import error_responses
from api.routes import admin_batches, admin_policy, admin_requests, admin_tenants, console
from api.state import State
from api.streams.subscription import valid_id
from llmq import registry
from llmq.admin import AUDIT_PAGE_MAX, audit_trail

router = APIRouter(prefix="/admin", tags=["admin"])

WorkerId = Annotated[str, Path(min_length=1, max_length=200)]


@router.get("/pool", responses=error_responses(*REFUSALS))
async def pool(state: State, _: AdminCaller) -> dict[str, Any]:
    """Each model's workers and slots; each live worker: host, engine, slots used and
    free, prefix cache hit rate, whether it is ready or drained."""
    return await pool_view.pool(state)


@router.get("/queue", responses=error_responses(*REFUSALS))
async def queue(state: State, _: AdminCaller) -> dict[str, Any]:
    """Each model's queue: depth, running, held for a prefix holder, by priority, by tenant."""
    return await pool_view.queue(state)


@router.post("/workers/{worker_id}/drain", responses=error_responses(*REFUSALS, 404))
async def drain(worker_id: WorkerId, state: State, who: AdminCaller) -> dict[str, Any]:
    """The worker finishes its runs and claims nothing more (it stays registered,
    ``draining``, until it is stopped)."""
    live = {w.id for w in await state.catalog.workers()}
    if worker_id not in live:
        raise NotFound(f"no live worker '{worker_id}'", param="worker_id", code="worker_not_found")
    await registry.drain(state.redis, worker_id)
    await audit(state, who, "worker.drain", worker_id)
    return {"id": worker_id, "object": "worker", "draining": True}


@router.get("/audit", responses=error_responses(*REFUSALS, 400))
async def audit_list(
    state: State,
    _: AdminCaller,
    limit: Annotated[int, Query(ge=1, le=AUDIT_PAGE_MAX)] = 100,
    before: Annotated[str | None, Query(max_length=40)] = None,
) -> dict[str, Any]:
    """The newest admin actions first; ``before``: an entry's id, for the next page."""
    if before is not None and not valid_id(before):
        raise InvalidRequest(
            "before must be an audit entry's id", param="before", code="invalid_value"
        )
    found = await audit_trail(state.redis, limit, before or "+")
    return {
        "object": "list",
        "data": [e.model_dump() for e in found],
        "has_more": len(found) == limit,
    }


def install(app: FastAPI) -> None:
    """The admin API's routes, and the console that is its client."""
    for module in (
        router,
        admin_requests.router,
        admin_tenants.router,
        admin_batches.router,
        admin_policy.router,
    ):
        app.include_router(module)
    console.install(app)
