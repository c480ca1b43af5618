"""The autoscaler's leader lease: only one controller acts at a time.

Run two controllers for availability; the one holding ``llmq:autoscaler:leader``
acts, the other only tries to take it. Taking and renewing are one script (SET NX
PX, or PEXPIRE if the key still names this controller), so a controller never
renews a lease another one took meanwhile.

A controller acts only while its lease is surely still valid by its own clock:
until ``ttl`` (less a margin for the action to land) after the moment it *sent*
the renewal; the key cannot expire in Redis earlier than that. A controller that
stalled longer than the lease (a pause, a slow Redis) finds its lease expired on
waking and does not act on the decision it computed before the stall.
"""

from __future__ import annotations

import secrets
import socket
import time

from redis.asyncio import Redis

from llmq.protocol import keys

#: KEYS: lease. ARGV: owner id, ttl ms. 1 when the caller holds the lease afterwards.
HOLD = """
local lease_key = KEYS[1]
local owner, ttl_ms = ARGV[1], ARGV[2]
if redis.call('GET', lease_key) == owner then
  redis.call('PEXPIRE', lease_key, ttl_ms)
  return 1
end
if redis.call('SET', lease_key, owner, 'NX', 'PX', ttl_ms) then
  return 1
end
return 0
"""

#: KEYS: lease. ARGV: owner id. Deletes the lease only if the caller holds it.
RELEASE = """
local lease_key = KEYS[1]
local owner = ARGV[1]
if redis.call('GET', lease_key) == owner then
  return redis.call('DEL', lease_key)
end
return 0
"""


def new_owner_id() -> str:
    return f"autoscaler-{socket.gethostname()}-{secrets.token_hex(3)}"


class LeaderLease:
    def __init__(self, redis: Redis, ttl_seconds: float, owner: str | None = None) -> None:
        self.redis = redis
        self.ttl_seconds = ttl_seconds
        self.owner = owner or new_owner_id()
        self._valid_until = 0.0
        self._hold = redis.register_script(HOLD)
        self._release = redis.register_script(RELEASE)

    async def hold(self) -> bool:
        """Take or renew the lease; True if this controller holds it now."""
        sent = time.monotonic()
        held = await self._hold(
            keys=[keys.AUTOSCALER_LEADER], args=[self.owner, int(self.ttl_seconds * 1000)]
        )
        if held:
            # a margin for the action itself to land before the lease could expire
            self._valid_until = sent + self.ttl_seconds - min(0.5, self.ttl_seconds / 4)
        else:
            self._valid_until = 0.0
        return bool(held)

    def valid(self) -> bool:
        """Still surely the leader by this process's clock (checked right before acting)."""
        return time.monotonic() < self._valid_until

    async def release(self) -> None:
        self._valid_until = 0.0
        await self._release(keys=[keys.AUTOSCALER_LEADER], args=[self.owner])
