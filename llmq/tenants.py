"""Tenants: who shares the pool, with what weight and limits, and the keys that are theirs.

A tenant has a name, a weight (its share of the pool when tenants compete), limits
(tokens per minute, requests per minute, requests at once; 0 is no limit) and the
most urgent priority its requests may ask for. Tenants live in Redis (one hash per
tenant in its own slot, and the set of names); API keys are stored as digests
(:func:`digest`) beside the name of their tenant, never the key itself. The
``llmq tenant`` and ``llmq key`` commands manage them (:mod:`cli.tenants`); a
tenants file (TOML, :func:`read_file`) declares them for a deployment kept in git.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
import tomllib
from pathlib import Path
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from redis.asyncio import Redis

from llmq.protocol import keys

#: A tenant's name: also part of Redis key names and metric labels.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"

#: The prefix of every key ``llmq key create`` makes.
KEY_PREFIX = "sk-llmq-"


#: Tenants named in metric labels (the first by name, and the default); the rest are
#: counted together as ``other``, so that a label set stays bounded.
LABELED_TENANTS = 20

#: How often a process rereads which tenants are named in labels.
LABELS_REFRESH_SECONDS = 10.0


class TenantError(ValueError):
    """A tenant or key operation refused: unknown name, bad value, duplicate."""


class Tenant(BaseModel):
    """One tenant's settings; every limit 0 means none."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=NAME_PATTERN)
    weight: float = Field(1.0, gt=0, le=1_000_000, description="Share of the pool when busy.")
    tokens_per_minute: int = Field(0, ge=0, description="Prompt + max_tokens per minute.")
    requests_per_minute: int = Field(0, ge=0)
    max_concurrent: int = Field(0, ge=0, description="Requests queued or running at once.")
    #: The most urgent (lowest) priority its requests may ask for; None: the API's own.
    min_priority: int | None = None

    @property
    def limited(self) -> bool:
        return bool(self.tokens_per_minute or self.requests_per_minute or self.max_concurrent)


class KeyEntry(BaseModel):
    """What is stored of one API key (under its digest)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    tenant: str
    created_at: float
    #: The key's first characters, to tell keys apart in a listing.
    hint: str


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def digest(key: str) -> str:
    """What is stored of a key, and what a request records as its owner."""
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def key_id(key_digest: str) -> str:
    """The short id that ``llmq key list`` shows and ``llmq key revoke`` takes."""
    return key_digest[:12]


def parse_tenant(data: dict[str, Any]) -> Tenant:
    """A tenant from untrusted fields; :class:`TenantError` says what is wrong."""
    try:
        return Tenant.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "tenant"
        raise TenantError(f"{where}: {first['msg']}") from None


class TenantStore:
    """Tenants and keys in Redis."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    async def get(self, name: str) -> Tenant | None:
        raw = await cast("Any", self.redis.hget(keys.tenant(name), "spec"))
        return None if raw is None else Tenant.model_validate_json(raw)

    async def names(self) -> list[str]:
        return sorted(text(n) for n in await cast("Any", self.redis.smembers(keys.TENANTS)))

    async def all(self) -> list[Tenant]:
        found = [await self.get(n) for n in await self.names()]
        return [t for t in found if t is not None]

    async def put(self, tenant: Tenant, *, create: bool | None = None) -> None:
        """Write ``tenant``; ``create`` True refuses an existing name, False a missing one."""
        exists = await self.get(tenant.name) is not None
        if create is True and exists:
            raise TenantError(f"tenant '{tenant.name}' exists already")
        if create is False and not exists:
            raise TenantError(f"no tenant '{tenant.name}'")
        await cast(
            "Any", self.redis.hset(keys.tenant(tenant.name), "spec", tenant.model_dump_json())
        )
        await cast("Any", self.redis.sadd(keys.TENANTS, tenant.name))

    async def update(self, name: str, changes: dict[str, Any]) -> Tenant:
        found = await self.get(name)
        if found is None:
            raise TenantError(f"no tenant '{name}'")
        tenant = parse_tenant({**found.model_dump(), **changes})
        await self.put(tenant)
        return tenant

    async def delete(self, name: str) -> int:
        """Delete a tenant and revoke its keys; returns how many keys were revoked."""
        if await self.get(name) is None:
            raise TenantError(f"no tenant '{name}'")
        revoked = [d for d, entry in await self.keys() if entry.tenant == name]
        if revoked:
            await cast("Any", self.redis.hdel(keys.API_KEYS, *revoked))
        await self.redis.delete(keys.tenant(name), *keys.quota_keys(name))
        await cast("Any", self.redis.srem(keys.TENANTS, name))
        return len(revoked)

    async def create_key(self, tenant: str) -> str:
        """A new key of ``tenant``: returned once, stored only as its digest."""
        if await self.get(tenant) is None:
            raise TenantError(f"no tenant '{tenant}'")
        key = KEY_PREFIX + secrets.token_urlsafe(24)
        entry = KeyEntry(tenant=tenant, created_at=time.time(), hint=key[: len(KEY_PREFIX) + 4])
        await cast("Any", self.redis.hset(keys.API_KEYS, digest(key), entry.model_dump_json()))
        return key

    async def add_key(self, tenant: str, key_digest: str, hint: str = "") -> None:
        """Store a key given by its digest (a tenants file lists digests, never keys)."""
        entry = KeyEntry(tenant=tenant, created_at=time.time(), hint=hint)
        await cast("Any", self.redis.hset(keys.API_KEYS, key_digest, entry.model_dump_json()))

    async def keys(self) -> list[tuple[str, KeyEntry]]:
        raw = await cast("Any", self.redis.hgetall(keys.API_KEYS))
        entries = [(text(d), KeyEntry.model_validate_json(v)) for d, v in raw.items()]
        return sorted(entries, key=lambda e: (e[1].tenant, e[1].created_at))

    async def key_tenant(self, key_digest: str) -> str | None:
        """The tenant of the key with this digest; None for no such key."""
        raw = await cast("Any", self.redis.hget(keys.API_KEYS, key_digest))
        return None if raw is None else KeyEntry.model_validate_json(raw).tenant

    async def revoke(self, prefix: str) -> str:
        """Revoke the one key whose digest starts with ``prefix`` (its id); returns it."""
        if len(prefix) < 6:
            raise TenantError("give at least 6 characters of the key's id")
        found = [d for d, _ in await self.keys() if d.startswith(prefix)]
        if len(found) != 1:
            raise TenantError(f"{'no' if not found else 'more than one'} key matches '{prefix}'")
        await cast("Any", self.redis.hdel(keys.API_KEYS, found[0]))
        return found[0]


def read_file(path: str | Path) -> tuple[list[Tenant], list[tuple[str, str]]]:
    """The tenants of a TOML file, and its keys as (tenant, digest) pairs.

    One table per tenant::

        [tenants.acme]
        weight = 3
        tokens_per_minute = 200000
        key_digests = ["<digest of a key>"]   # llmq key digest <key>
    """
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise TenantError(f"{path}: {exc}") from None
    tenants: list[Tenant] = []
    digests: list[tuple[str, str]] = []
    table = data.get("tenants", {})
    if not isinstance(table, dict):
        raise TenantError(f"{path}: [tenants] must be a table of tenants")
    for name, fields in table.items():
        if not isinstance(fields, dict):
            raise TenantError(f"{path}: tenants.{name} must be a table")
        fields = dict(fields)
        for d in fields.pop("key_digests", []):
            digests.append((name, str(d)))
        try:
            tenants.append(parse_tenant({"name": name, **fields}))
        except TenantError as exc:
            raise TenantError(f"{path}: tenants.{name}: {exc}") from None
    return tenants, digests


async def load_file(store: TenantStore, path: str | Path) -> int:
    """Write the tenants and keys of a tenants file into Redis; returns how many tenants."""
    tenants, digests = read_file(path)
    for tenant in tenants:
        await store.put(tenant)
    for name, key_digest in digests:
        await store.add_key(name, key_digest, hint="(file)")
    return len(tenants)


class TenantLabels:
    """A tenant's metric label: its name for the first :data:`LABELED_TENANTS` tenants
    by name (and ``default``), else ``other``; the names reread every
    :data:`LABELS_REFRESH_SECONDS`.

    A label asked for while the names are being read waits for that read (one read,
    shared): a fresh process's first requests, arriving together, would otherwise be
    counted as ``other`` before the first read returns.
    """

    def __init__(self, redis: Redis, default: str = "default") -> None:
        self.redis = redis
        self.named = frozenset({default})
        self.default = default
        self._read_at = -LABELS_REFRESH_SECONDS
        self._reading: asyncio.Task[None] | None = None

    async def label(self, name: str) -> str:
        if self._reading is None and time.monotonic() - self._read_at > LABELS_REFRESH_SECONDS:
            self._reading = asyncio.create_task(self._read())
        if self._reading is not None:
            # shielded: a caller cancelled does not cancel the read the others wait on
            await asyncio.shield(self._reading)
        return name if name in self.named else "other"

    async def _read(self) -> None:
        try:
            names = sorted(text(n) for n in await cast("Any", self.redis.smembers(keys.TENANTS)))
            self.named = frozenset({self.default, *names[:LABELED_TENANTS]})
        finally:
            self._read_at = time.monotonic()
            self._reading = None
