"""A tenant's quota, shared by every API process: taken at admission, returned at the end.

Admission takes, in one script in the tenant's slot (``lua/quota_take.lua``, built by
:func:`take_slots`, run with the request's record by
:meth:`llmq.protocol.queue.Queue.admit`, read by :func:`parse_take`), a request from
the tenant's request bucket, the request's tokens (prompt +
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
from llmq.protocol.slots import QuotaReturn, QuotaTake


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


def take_slots(
    tenant: str, limits: Limits, hold_ms: int, reservations: list[tuple[str, int]]
) -> QuotaTake:
    """The slots of ``quota_take.lua``."""
    return QuotaTake(
        *keys.quota_keys(tenant),
        tpm=limits.tokens_per_minute,
        rpm=limits.requests_per_minute,
        max_concurrent=limits.max_concurrent,
        hold_ms=hold_ms,
        count=len(reservations),
        reservations=[x for rid, tokens in reservations for x in (rid, tokens)],
    )


def parse_take(reply: list[Any]) -> Verdict:
    n = [int(x) for x in reply[:8]]
    return Verdict(bool(n[0]), n[1], n[2], n[3], n[4], n[5], n[6], n[7], as_str(reply[8]))


class Quota:
    """The quota scripts on one Redis client."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self.scripts = scripts_for(redis)

    async def give_back(self, tenant: str, request_id: str, used: int) -> int:
        """Return the request's place and its unused tokens; the tokens given back."""
        slots = QuotaReturn(*keys.quota_keys(tenant), id=request_id, used=used)
        return int(await slots.run(self.scripts))
