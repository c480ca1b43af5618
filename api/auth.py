"""Optional API keys: bearer auth, and requests visible only to the key that made them.

With ``LLMQ_API_KEYS`` empty, auth is off. Otherwise every generation, request and
model endpoint needs ``Authorization: Bearer <key>``; keys are compared in
constant time (every configured key is compared, whichever matches). A request
records only a digest of its key (its *owner*), and its status, stream and cancel
answer 404 to any other key, as if it did not exist. Health and metrics stay open
for probes and scrapers.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Annotated

from fastapi import Depends, Request

from api.errors import ApiError
from api.state import state_of


class Unauthorized(ApiError):
    status = 401


def owner_of(key: str) -> str:
    """What a request stores about its key: a digest, never the key."""
    return hashlib.sha256(key.encode()).hexdigest()[:32]


async def caller(request: Request) -> str | None:
    """The caller's owner id, or None when auth is off; 401 for a missing or wrong key.

    It reads the state directly rather than through the ``State`` dependency: one
    resolution step less on every request."""
    state = state_of(request)
    if not state.api_keys:
        return None
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    given = token.strip().encode()
    matched = False
    for key in state.api_keys:
        matched |= hmac.compare_digest(given, key.encode())
    if scheme.lower() != "bearer" or not matched:
        raise Unauthorized(
            "a valid API key is required: Authorization: Bearer <key>",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return owner_of(token.strip())


#: The authenticated caller as a FastAPI dependency (None when auth is off).
Caller = Annotated[str | None, Depends(caller)]
