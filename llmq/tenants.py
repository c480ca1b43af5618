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
import re
import secrets
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, cast

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError
from redis.asyncio import Redis

from llmq.protocol import keys

#: A tenant's name: also part of Redis key names and metric labels.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"

#: The prefix of every key ``llmq key create`` makes.
KEY_PREFIX = "sk-llmq-"

#: A key's digest (:func:`digest`): what a tenants file lists and Redis stores.
DIGEST_PATTERN = re.compile(r"^[0-9a-f]{32}$")

#: The largest weight: a share of the pool a million times another's.
MAX_WEIGHT = 1_000_000


#: Tenants named in metric labels (the first by name, and the default); the rest are
#: counted together as ``other``, so that a label set stays bounded.
LABELED_TENANTS = 20

#: How often a process rereads which tenants are named in labels.
LABELS_REFRESH_SECONDS = 10.0


class TenantError(ValueError):
    """A tenant or key operation refused: unknown name, bad value, duplicate."""


class Tenant(BaseModel):
    """One tenant's settings; every limit 0 means none.

    Strict: the commands and a tenants file are held to the same types, so a file's
    ``weight = "2"`` (a string) is refused, not read as 2; an unknown field is refused
    too (a misspelled limit would otherwise be no limit).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    name: str = Field(pattern=NAME_PATTERN)
    weight: float = Field(
        1.0, gt=0, le=MAX_WEIGHT, allow_inf_nan=False, description="Share of the pool when busy."
    )
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


def _key_digest(value: str) -> str:
    if not DIGEST_PATTERN.match(value):
        raise PydanticCustomError(
            "key_digest",
            "'{value}' is not a key digest (32 lowercase hex digits: `llmq key digest KEY`)",
            {"value": value},
        )
    return value


class FileTenant(Tenant):
    """A table of a tenants file: a tenant (validated as the commands validate it) and
    the digests of its keys."""

    key_digests: list[Annotated[str, AfterValidator(_key_digest)]] = []

    def tenant(self) -> Tenant:
        return Tenant.model_validate(self.model_dump(exclude={"key_digests"}))


class TenantsFile(BaseModel):
    """A tenants file: one table, ``[tenants]``, of tenants by name. Anything else in
    it (a misspelled table, a field no tenant has) is refused, as is a key digest
    listed under two tenants: the file says whose each key is, once."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    tenants: dict[str, FileTenant]

    @field_validator("tenants", mode="before")
    @classmethod
    def _named(cls, value: Any) -> Any:
        """Each table's name is its tenant's (a ``name`` field in it is refused)."""
        if not isinstance(value, dict):
            return value
        named: dict[str, Any] = {}
        for name, fields in value.items():
            if isinstance(fields, dict) and "name" in fields:
                raise PydanticCustomError(
                    "name_field",
                    "a tenant's name is its table's",
                    {"table": f"tenants.{name}", "field": "name"},
                )
            named[name] = {**fields, "name": name} if isinstance(fields, dict) else fields
        return named

    @model_validator(mode="after")
    def _keys_once(self) -> TenantsFile:
        owners: dict[str, str] = {}
        for name, entry in self.tenants.items():
            for key_digest in entry.key_digests:
                first = owners.setdefault(key_digest, name)
                if first != name:
                    raise PydanticCustomError(
                        "key_digest_twice",
                        "{digest} is listed under [tenants.{first}] too: a key is one tenant's",
                        {
                            "digest": key_digest,
                            "first": first,
                            "table": f"tenants.{name}",
                            "field": "key_digests",
                        },
                    )
        return self


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


def read_file(path: str | Path) -> TenantsFile:
    """The tenants of a TOML file and the digests of their keys, all valid, or
    :class:`TenantError` naming the first thing wrong: the line of its table, the
    table, the field.

    One table per tenant::

        [tenants.acme]
        weight = 3
        tokens_per_minute = 200000
        key_digests = ["<digest of a key>"]   # llmq key digest <key>
    """
    source = _source(path)
    try:
        data = tomllib.loads(source)
    except tomllib.TOMLDecodeError as exc:
        raise TenantError(f"{path}: {exc}") from None
    try:
        return TenantsFile.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        # a misspelled table before the [tenants] it leaves missing
        first = min(errors, key=lambda e: e["type"] != "extra_forbidden")
        loc = [str(p) for p in first["loc"]]
        table, field = ".".join(loc[:2]), ".".join(loc[2:])
        context = first.get("ctx") or {}
        if "table" in context:
            table, field = str(context["table"]), str(context["field"])
        msg = first["msg"]
        if first["type"] == "extra_forbidden":
            msg = "unknown table" if len(loc) == 1 else "unknown field"
        if len(loc) <= 1 and first["type"] in ("extra_forbidden", "missing"):
            msg += ": a tenants file's tenants are its [tenants.NAME] tables"
        raise TenantError(located(path, table, field, msg)) from None


def _source(path: str | Path) -> str:
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise TenantError(f"{path}: {exc}") from None


def located(path: str | Path, table: str, field: str, msg: str) -> str:
    """``path:line: [table] field: msg``, the line that of the table's header where it
    has one (a table given inline has none)."""
    if not table:
        return f"{path}: {msg}"
    parts = r"\s*\.\s*".join(f'"?{re.escape(p)}"?' for p in table.split("."))
    header = re.compile(rf"^\s*\[\s*{parts}\s*[.\]]")
    lines = _source(path).splitlines()
    line = next((n for n, text_line in enumerate(lines, 1) if header.match(text_line)), None)
    where = f"[{table}]" + (f" {field}" if field else "")
    return f"{path}{f':{line}' if line else ''}: {where}: {msg}"


async def load_file(store: TenantStore, path: str | Path) -> int:
    """Write the tenants and keys of a tenants file into Redis; returns how many tenants.

    All or nothing: the file is checked whole before anything is written, and a key
    digest that Redis holds for another tenant is refused (a file does not move a key:
    ``llmq key revoke`` it first)."""
    found = read_file(path)
    for name, entry in found.tenants.items():
        for key_digest in entry.key_digests:
            owner = await store.key_tenant(key_digest)
            if owner is not None and owner != name:
                raise TenantError(
                    located(
                        path,
                        f"tenants.{name}",
                        "key_digests",
                        f"{key_digest} is a key of tenant '{owner}'"
                        f" (revoke it first: llmq key revoke {key_id(key_digest)})",
                    )
                )
    for entry in found.tenants.values():
        await store.put(entry.tenant())
    for name, entry in found.tenants.items():
        for key_digest in entry.key_digests:
            await store.add_key(name, key_digest, hint="(file)")
    return len(found.tenants)


class TenantLabels:
    """A tenant's metric label: its name for the first :data:`LABELED_TENANTS` tenants
    by name (and ``default``), else ``other``; the names reread every
    :data:`LABELS_REFRESH_SECONDS`.

    A label asked for while the names are being read waits for that read (one read,
    shared): a fresh process's first requests, arriving together, would otherwise be
    counted as ``other`` before the first read returns.
    """

    def __init__(self, redis: Redis, default: Callable[[], str] = lambda: "default") -> None:
        self.redis = redis
        self.named: frozenset[str] = frozenset()
        #: The default tenant's name, read at each label (the pool policy may change it).
        self.default = default
        self._read_at = -LABELS_REFRESH_SECONDS
        self._reading: asyncio.Task[None] | None = None

    async def label(self, name: str) -> str:
        if self._reading is None and time.monotonic() - self._read_at > LABELS_REFRESH_SECONDS:
            self._reading = asyncio.create_task(self._read())
        if self._reading is not None:
            # shielded: a caller cancelled does not cancel the read the others wait on
            await asyncio.shield(self._reading)
        return name if name in self.named or name == self.default() else "other"

    async def _read(self) -> None:
        try:
            names = sorted(text(n) for n in await cast("Any", self.redis.smembers(keys.TENANTS)))
            self.named = frozenset(names[:LABELED_TENANTS])
        finally:
            self._read_at = time.monotonic()
            self._reading = None


def unused_weights(fairness: str, tenants: list[Tenant]) -> str | None:
    """What an operator should hear when tenants have weights that the pool's fairness
    does not use (``fifo`` serves the queue's order): the line the CLI prints and the API
    logs, or None when every weight takes effect."""
    weighted = sorted(t.name for t in tenants if t.weight != 1)
    if fairness == "vtc" or not weighted:
        return None
    return (
        f"LLMQ_FAIRNESS={fairness}: the weights of {', '.join(weighted)} take no effect "
        "(fair share among tenants needs LLMQ_FAIRNESS=vtc, the default)"
    )
