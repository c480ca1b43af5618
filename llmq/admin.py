"""The operator's keys and the audit trail of what they did.

An admin key (``llmq key create --admin``) opens the admin API (``/admin/``) and the
console on it; it is no tenant's key and a tenant's key never opens them. Like a
tenant's key, it is stored only as its digest (:func:`llmq.tenants.digest`), beside
a name and the key's first characters, in its own hash (``keys.ADMIN_KEYS``): a
lookup of a tenant's key can never find it, nor the other way round.

Every action of the admin API is appended to one capped stream (``keys.AUDIT``):
who (the admin key's id and name), what, on what, when. The cap bounds it
(:data:`AUDIT_MAXLEN`, approximate as Redis trims whole nodes).
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, Field
from redis.asyncio import Redis

from llmq.protocol import keys
from llmq.tenants import KEY_PREFIX, NAME_PATTERN, TenantError, TenantStore, digest, key_id, text

#: The prefix of an admin key: told apart from a tenant's at a glance.
ADMIN_KEY_PREFIX = KEY_PREFIX + "admin-"

#: About how many audit entries are kept (the oldest are trimmed).
AUDIT_MAXLEN = 10_000

#: The most audit entries one read returns.
AUDIT_PAGE_MAX = 500


class AdminKey(BaseModel):
    """What is stored of one admin key (under its digest)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    name: str = Field(pattern=NAME_PATTERN)
    created_at: float
    hint: str


class AuditEntry(BaseModel):
    """One admin action: who did what to what, when."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    id: str = ""
    ts: float
    #: The admin key's id (:func:`llmq.tenants.key_id`) and its name.
    who: str
    name: str
    action: str
    target: str = ""
    detail: dict[str, Any] = Field(default_factory=dict)


async def create_admin_key(redis: Redis, name: str = "admin") -> str:
    """A new admin key: returned once, stored only as its digest."""
    key = ADMIN_KEY_PREFIX + secrets.token_urlsafe(24)
    hint = key[: len(ADMIN_KEY_PREFIX) + 4]
    try:
        made = AdminKey(name=name, created_at=time.time(), hint=hint)
    except ValueError:
        raise TenantError(f"an admin key's name must match {NAME_PATTERN}") from None
    await cast("Any", redis.hset(keys.ADMIN_KEYS, digest(key), made.model_dump_json()))
    return key


async def admin_key(redis: Redis, key_digest: str) -> AdminKey | None:
    """The admin key with this digest; None for no such key."""
    raw = await cast("Any", redis.hget(keys.ADMIN_KEYS, key_digest))
    return None if raw is None else AdminKey.model_validate_json(raw)


async def admin_keys(redis: Redis) -> list[tuple[str, AdminKey]]:
    raw = await cast("Any", redis.hgetall(keys.ADMIN_KEYS))
    found = [(text(d), AdminKey.model_validate_json(v)) for d, v in raw.items()]
    return sorted(found, key=lambda e: e[1].created_at)


async def revoke_admin_key(redis: Redis, prefix: str) -> str | None:
    """Revoke the one admin key whose id starts with ``prefix``; None if none matches."""
    found = [d for d, _ in await admin_keys(redis) if d.startswith(prefix)]
    if len(found) > 1:
        raise TenantError(f"more than one admin key matches '{prefix}'")
    if not found:
        return None
    await cast("Any", redis.hdel(keys.ADMIN_KEYS, found[0]))
    return found[0]


async def revoke_key(redis: Redis, prefix: str) -> str:
    """Revoke the one key, an operator's or a tenant's, whose id starts with ``prefix``;
    returns its digest (:class:`TenantError` when none or several match)."""
    if len(prefix) < 6:
        raise TenantError("give at least 6 characters of the key's id")
    found = await revoke_admin_key(redis, prefix)
    return found if found is not None else await TenantStore(redis).revoke(prefix)


async def audit(
    redis: Redis,
    who: str,
    name: str,
    action: str,
    target: str = "",
    **detail: Any,
) -> None:
    """Append one action to the audit trail (capped at about :data:`AUDIT_MAXLEN`)."""
    entry = AuditEntry(
        ts=time.time(), who=key_id(who), name=name, action=action, target=target, detail=detail
    )
    await redis.xadd(
        keys.AUDIT,
        {"data": entry.model_dump_json(exclude={"id"})},
        maxlen=AUDIT_MAXLEN,
        approximate=True,
    )


async def audit_trail(redis: Redis, limit: int, before: str = "+") -> list[AuditEntry]:
    """The newest ``limit`` entries (at most :data:`AUDIT_PAGE_MAX`) before the id
    ``before`` (exclusive; ``+``: the newest)."""
    limit = min(limit, AUDIT_PAGE_MAX)
    end = before if before == "+" else f"({before}"
    found = await redis.xrevrange(keys.AUDIT, max=end, min="-", count=limit)
    out = []
    for entry_id, fields in found:
        data = json.loads(next((text(v) for k, v in fields.items() if text(k) == "data"), "{}"))
        out.append(AuditEntry.model_validate({**data, "id": text(entry_id)}))
    return out
