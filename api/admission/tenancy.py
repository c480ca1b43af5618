"""Which tenant a request belongs to, resolved per request with a short local cache.

With auth on, a request's key names its tenant: a key of ``LLMQ_API_KEYS`` belongs
to the default tenant (the pool policy's ``default_tenant``, followed live), a key
made with ``llmq key create`` to its own (looked up by digest in Redis). With auth
off, the trusted header ``LLMQ_TENANT_HEADER`` (set by a gateway in front) names the
tenant, else the request is the default tenant's. A tenant's settings are read from Redis; the
default tenant without an entry there has no limits.

Lookups are cached in this process for :data:`CACHE_SECONDS`, so a revoked key,
a deleted tenant or changed limits take effect on every API process within that
time, at one Redis read per key (or tenant) and process per period.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Generic, TypeVar

from llmq.tenants import Tenant, TenantLabels, TenantStore

T = TypeVar("T")

#: How long a looked-up key or tenant is trusted here.
CACHE_SECONDS = 0.5

#: Most entries kept; the cache is emptied when it holds more.
CACHE_MAX = 10_000


class _Cache(Generic[T]):
    """Values trusted for :data:`CACHE_SECONDS`; at most :data:`CACHE_MAX` of them."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[float, T]] = {}

    def get(self, key: str) -> tuple[bool, T | None]:
        hit = self._entries.get(key)
        if hit is not None and hit[0] > time.monotonic():
            return True, hit[1]
        return False, None

    def put(self, key: str, value: T) -> T:
        if len(self._entries) >= CACHE_MAX:
            self._entries.clear()
        self._entries[key] = (time.monotonic() + CACHE_SECONDS, value)
        return value


class Tenancy:
    """Key and tenant lookups of one API process."""

    def __init__(self, store: TenantStore, default: Callable[[], str]) -> None:
        self.store = store
        #: The default tenant's name, as the live pool policy says now.
        self.default = default
        self._keys: _Cache[str | None] = _Cache()
        self._tenants: _Cache[Tenant | None] = _Cache()
        #: The tenants' metric labels (bounded).
        self.labels = TenantLabels(store.redis, default)

    async def key_tenant(self, key_digest: str) -> str | None:
        """The tenant of the key with this digest, None when there is no such key."""
        hit, name = self._keys.get(key_digest)
        if hit:
            return name
        return self._keys.put(key_digest, await self.store.key_tenant(key_digest))

    async def tenant(self, name: str) -> Tenant | None:
        """The tenant's settings; None if no such tenant (the default always exists)."""
        hit, found = self._tenants.get(name)
        if not hit:
            found = self._tenants.put(name, await self.store.get(name))
        if found is None and name == self.default():  # checked after the cache: it may change
            return Tenant(name=name)
        return found
