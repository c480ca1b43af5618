"""The admin API's tenants and keys: the operations of ``llmq tenant`` and ``llmq key``.

The same functions as the commands (:mod:`llmq.tenants`, :mod:`llmq.tenant_usage`,
:mod:`llmq.admin`): the commands keep talking to Redis directly, the admin API is
for the console and for operators without Redis at hand. A key is shown once, in the
answer that created it, and never again: listings show its id and first characters.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path
from pydantic import BaseModel, ConfigDict, Field

from api.admin import REFUSALS, AdminCaller, audit
from api.errors import InvalidRequest, NotFound
from api.openapi import error_responses
from api.state import AppState, State
from llmq import admin
from llmq.tenant_usage import last_hour, tenant_usage
from llmq.tenants import (
    NAME_PATTERN,
    Tenant,
    TenantError,
    TenantStore,
    digest,
    key_id,
    parse_tenant,
)

router = APIRouter(prefix="/admin", tags=["admin"])

KeyId = Annotated[str, Path(min_length=6, max_length=32, pattern=r"^[0-9a-f]+$")]


class NewKey(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    #: The tenant whose key it is; None with ``admin``.
    tenant: str | None = Field(None, pattern=NAME_PATTERN)
    #: An operator's key (the admin API), named ``name``.
    admin: bool = False
    name: str = Field("admin", pattern=NAME_PATTERN)


def _row(tenant: Tenant) -> dict[str, Any]:
    return tenant.model_dump()


@router.get("/tenants", responses=error_responses(*REFUSALS))
async def list_tenants(state: State, _: AdminCaller) -> dict[str, Any]:
    """Every tenant with its limits, its usage now (``llmq tenant list`` and ``stats``)
    and its usage per minute over the last hour."""
    store = TenantStore(state.redis)
    tenants = {t.name: t for t in await store.all()}
    names = sorted({state.tenancy.default(), *tenants})
    hour = await last_hour(state.redis, names)
    rows = []
    for name in names:
        usage = (await tenant_usage(state.redis, name)).model_dump(exclude={"name"})
        limits = _row(tenants[name]) if name in tenants else {"name": name}
        rows.append({**limits, "usage": usage, "last_hour": hour[name].model_dump()})
    return {"object": "list", "data": rows}


@router.post("/tenants", status_code=201, responses=error_responses(*REFUSALS, 400))
async def create_tenant(body: dict[str, Any], state: State, who: AdminCaller) -> dict[str, Any]:
    """A new tenant (``llmq tenant create``): its name, weight and limits."""
    try:
        tenant = parse_tenant(body)
        await TenantStore(state.redis).put(tenant, create=True)
    except TenantError as exc:
        raise InvalidRequest(str(exc), code="invalid_value") from None
    await audit(state, who, "tenant.create", tenant.name, **tenant.model_dump(exclude={"name"}))
    return _row(tenant)


async def _keys(state: AppState) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = [
        {"id": key_id(d), "tenant": e.tenant, "admin": False, **_when(e.created_at, e.hint)}
        for d, e in await TenantStore(state.redis).keys()
    ]
    rows += [
        {"id": key_id(d), "name": e.name, "admin": True, **_when(e.created_at, e.hint)}
        for d, e in await admin.admin_keys(state.redis)
    ]
    return rows


def _when(created_at: float, hint: str) -> dict[str, Any]:
    return {"created_at": created_at, "hint": hint}


@router.get("/keys", responses=error_responses(*REFUSALS))
async def list_keys(state: State, _: AdminCaller) -> dict[str, Any]:
    """Every key's id, tenant (or admin name), creation and first characters; never a key."""
    return {"object": "list", "data": await _keys(state)}


@router.post("/keys", status_code=201, responses=error_responses(*REFUSALS, 400))
async def create_key(body: NewKey, state: State, who: AdminCaller) -> dict[str, Any]:
    """A new key, in this answer only (``llmq key create``)."""
    if body.admin == (body.tenant is not None):
        raise InvalidRequest("give a tenant, or admin: true", param="tenant", code="invalid_value")
    try:
        if body.admin:
            key = await admin.create_admin_key(state.redis, body.name)
        else:
            key = await TenantStore(state.redis).create_key(str(body.tenant))
    except TenantError as exc:
        raise InvalidRequest(str(exc), param="tenant", code="invalid_value") from None
    made = key_id(digest(key))
    await audit(state, who, "key.create", made, tenant=body.tenant, admin=body.admin)
    return {"id": made, "object": "key", "key": key, "tenant": body.tenant, "admin": body.admin}


@router.delete("/keys/{key}", responses=error_responses(*REFUSALS, 404))
async def revoke_key(key: KeyId, state: State, who: AdminCaller) -> dict[str, Any]:
    """Revoke a key by its id (``llmq key revoke``): its next request gets 401."""
    try:
        found = await admin.revoke_key(state.redis, key)
    except TenantError as exc:
        raise NotFound(str(exc), param="key", code="key_not_found") from None
    await audit(state, who, "key.revoke", key_id(found))
    return {"id": key_id(found), "object": "key", "revoked": True}
