"""A tenant's quota, shared by every API process: taken at admission, returned at the end.

Admission takes, in one script in the tenant's slot (``lua/quota_take.lua``), a
request from the tenant's request bucket, the request's tokens (prompt +
max_tokens) from its token bucket and a place among its requests at once; all or
none, for every choice of one client request. The end of the request
(:meth:`Quota.give_back`, ``lua/quota_return.lua``) returns its place and the tokens
it reserved but did not generate; only the first return counts, so the worker that
finished it and a sweep that ended it unstarted may both return it. A place whose
request was never returned (its API process and worker both crashed) lapses after
its hold: the longest the request could live.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from llmq.protocol import keys
from llmq.protocol.codec import as_str
from llmq.protocol.scripts import scripts_for


@dataclass(frozen=True)
class Limits:
    """A tenant's limits, as the quota scripts take them (0: none)."""

    tokens_per_minute: int = 0
    requests_per_minute: int = 0
    max_concurrent: int = 0

    @property
    def any(self) -> bool:
        return bool(self.tokens_per_minute or self.requests_per_minute or self.max_concurrent)


@dataclass(frozen=True)
class Verdict:
    """What a take answered: taken or not, and the figures of OpenAI's rate-limit headers."""

    taken: bool
    limit_requests: int
    remaining_requests: int
    reset_requests_ms: int
    limit_tokens: int
    remaining_tokens: int
    reset_tokens_ms: int
    #: How long until the take could succeed (ms; 0 when taken).
    retry_ms: int
    #: The limit that refused it: ``requests``, ``tokens``, ``concurrent``, or "".
    which: str


def take_call(
    tenant: str, limits: Limits, hold_ms: int, reservations: list[tuple[str, int]]
) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of ``quota_take.lua``."""
    pairs = [x for rid, tokens in reservations for x in (rid, tokens)]
    args = [
        limits.tokens_per_minute,
        limits.requests_per_minute,
        limits.max_concurrent,
        hold_ms,
        len(reservations),
        *pairs,
    ]
    return keys.quota_keys(tenant), args


def return_call(tenant: str, request_id: str, used: int) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of ``quota_return.lua``."""
    return keys.quota_keys(tenant), [request_id, used]


def parse_take(reply: list[Any]) -> Verdict:
    n = [int(x) for x in reply[:8]]
    return Verdict(bool(n[0]), n[1], n[2], n[3], n[4], n[5], n[6], n[7], as_str(reply[8]))


class Quota:
    """The quota scripts on one Redis client."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self.scripts = scripts_for(redis)

    async def take(
        self, tenant: str, limits: Limits, hold_ms: int, reservations: list[tuple[str, int]]
    ) -> Verdict:
        """Take a request, its tokens and a place at once for each (id, tokens)."""
        keys_, args = take_call(tenant, limits, hold_ms, reservations)
        return parse_take(await self.scripts.quota_take(keys=keys_, args=args))

    async def give_back(self, tenant: str, request_id: str, used: int) -> int:
        """Return the request's place and its unused tokens; the tokens given back."""
        keys_, args = return_call(tenant, request_id, used)
        return int(await self.scripts.quota_return(keys=keys_, args=args))
