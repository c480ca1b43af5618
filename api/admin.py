"""Who may use the admin API, and the audit line each of its actions writes.

Every ``/admin/`` route depends on :func:`admin`: the caller's bearer key must be an
admin key (:mod:`llmq.admin`), looked up by its digest on every call (no cache: a
revoked admin key stops at once). No key, or a key that is nobody's, is 401; a
tenant's key (``LLMQ_API_KEYS`` or ``llmq key create``) is 403: it is known, and
not allowed here. This holds whether or not the tenants' API has auth on.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request

from api.admission.auth import Unauthorized
from api.errors import ApiError
from api.state import AppState, state_of
from llmq import admin as admin_keys
from llmq.tenants import digest

#: The refusals every admin route may answer: no admin key (401), a tenant's (403).
REFUSALS = (401, 403)


class Forbidden(ApiError):
    status = 403
    type = "permission_error"


@dataclass(frozen=True)
class Admin:
    """The operator behind a call: their key's digest and its name."""

    digest: str
    name: str


async def _tenant_key(state: AppState, given: str) -> bool:
    matched = False
    for key in state.api_keys:
        matched |= hmac.compare_digest(given.encode(), key.encode())
    return matched or await state.tenancy.key_tenant(digest(given)) is not None


async def admin(request: Request) -> Admin:
    """The admin behind the call; 401 without a valid key, 403 for a tenant's key."""
    state = state_of(request)
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    given = token.strip()
    if scheme.lower() != "bearer" or not given:
        raise Unauthorized(
            "an admin key is required: Authorization: Bearer <admin key>",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    found = await admin_keys.admin_key(state.redis, digest(given))
    if found is not None:
        return Admin(digest(given), found.name)
    if await _tenant_key(state, given):
        raise Forbidden("a tenant's key does not open the admin API", code="not_admin")
    raise Unauthorized(
        "the admin key is not valid", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"}
    )


#: The admin behind the call, as a FastAPI dependency.
AdminCaller = Annotated[Admin, Depends(admin)]


async def audit(state: AppState, who: Admin, action: str, target: str = "", **detail: Any) -> None:
    """Write the action to the audit trail (after it succeeded: a refusal changed nothing)."""
    await admin_keys.audit(state.redis, who.digest, who.name, action, target, **detail)
