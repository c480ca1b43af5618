"""Optional API keys: bearer auth, each key a tenant's, and requests visible only to
the key that made them.

Auth is on when ``LLMQ_API_KEYS`` lists keys or ``LLMQ_TENANT_KEYS`` is set. Then
every generation, request and model endpoint needs ``Authorization: Bearer <key>``:
a key of ``LLMQ_API_KEYS`` (compared in constant time, every configured key
compared whichever matches) is the default tenant's; a key made with ``llmq key
create`` is found by its digest in Redis (:mod:`api.admission.tenancy`, cached for half a
second, so a revoked key stops working everywhere within that time). A request
records only a digest of its key (its *owner*), and its status, stream and cancel
answer 404 to any other key, as if it did not exist. Health and metrics stay open
for probes and scrapers.

Every request gets its tenant here, in its :class:`~api.admission.admission.Admission`
(:func:`admitted`): the key's, or with auth off the one the trusted
``LLMQ_TENANT_HEADER`` names, else the default tenant.
"""

from __future__ import annotations

import asyncio
import hmac
from typing import Annotated

from fastapi import Depends, Request

from api.admission.admission import Admission, keep, kept
from api.admission.tenancy import CACHE_SECONDS
from api.errors import ApiError
from api.state import AppState, state_of
from llmq.tenants import Tenant, digest


class Unauthorized(ApiError):
    status = 401


def owner_of(key: str) -> str:
    """What a request stores about its key: a digest, never the key."""
    return digest(key)


def _refused(
    message: str = "a valid API key is required: Authorization: Bearer <key>",
) -> Unauthorized:
    return Unauthorized(message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


async def _tenant(state: AppState, name: str) -> Tenant:
    tenant = await state.tenancy.tenant(name)
    if tenant is None:
        raise Unauthorized(f"no tenant '{name}'", code="invalid_tenant")
    return tenant


async def admitted(request: Request) -> Admission:
    """The request's admission with its owner and tenant; 401 for a missing or wrong key.

    Made once per request (kept in its state, for :class:`api.admission.flow.RateLimitHeaders`).
    It reads the state directly rather than through the ``State`` dependency: one
    resolution step less on every request."""
    found = kept(request.scope)
    if found is None:
        found = await _authenticate(request)
        keep(request, found)
    return found


async def _authenticate(request: Request) -> Admission:
    state = state_of(request)
    settings = state.settings
    if not state.api_keys and not settings.tenant_keys:
        named = settings.tenant_header and request.headers.get(settings.tenant_header)
        tenant = await _tenant(state, named or state.tenancy.default())
        return Admission(state, None, tenant)
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    given = token.strip()
    if scheme.lower() != "bearer" or not given:
        raise _refused()
    matched = False
    for key in state.api_keys:
        matched |= hmac.compare_digest(given.encode(), key.encode())
    owner = owner_of(given)
    revocable = None
    if matched:
        name: str | None = state.tenancy.default()
    elif settings.tenant_keys:
        name = await state.tenancy.key_tenant(owner)
        revocable = owner
    else:
        name = None
    if name is None:
        raise _refused()
    return Admission(state, owner, await _tenant(state, name), revocable=revocable)


async def caller(request: Request) -> str | None:
    """The caller's owner id, or None when auth is off; 401 for a missing or wrong key."""
    return (await admitted(request)).owner


#: How a stream ends when its key is revoked (OpenAI's code for a key that is not valid).
REVOKED_CODE = "invalid_api_key"
REVOKED_MESSAGE = "the API key was revoked"


async def revoked(admission: Admission) -> None:
    """Return once the request's key is revoked (never for a key that cannot be: one of
    ``LLMQ_API_KEYS``, or auth off); a stream that waits on it ends with its key."""
    key_digest = admission.revocable
    state = admission.state
    if key_digest is None:
        await asyncio.Event().wait()
    while await state.tenancy.key_tenant(key_digest or "") is not None:
        await asyncio.sleep(CACHE_SECONDS)


#: The authenticated caller as a FastAPI dependency (None when auth is off).
Caller = Annotated[str | None, Depends(caller)]
#: The request's admission as a FastAPI dependency (the generation routes').
Admitted = Annotated[Admission, Depends(admitted)]
