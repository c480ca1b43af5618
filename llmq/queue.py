"""The queue's semantics: Lua scripts that enqueue and claim atomically.

The queue of a model is arq's sorted set, scored by an *effective time*:
``arrival_ms + priority * priority_step_ms`` (never below 1, since arq treats a
score of 0 as "not queued"). Workers always take the lowest score, so equal
priorities are first-in first-out and a lower priority waits at most
``priority * step`` behind later arrivals. A claimed request leaves the queue for
the model's running set (scored by lease expiry), so running requests never sit
at the head of the queue the way they do in stock arq.
"""

from __future__ import annotations

import json
from typing import Any, cast

from redis.asyncio import Redis

from llmq import keys

#: KEYS: queue, job, record. ARGV: id, score, job, ttl_ms, max_depth, wake channel,
#: then record field/value pairs. Returns 1, or 0 when the queue is full.
ENQUEUE = """
local max_depth = tonumber(ARGV[5])
if max_depth > 0 and redis.call('ZCARD', KEYS[1]) >= max_depth then
  return 0
end
redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('HSET', KEYS[3], unpack(ARGV, 7))
redis.call('PEXPIRE', KEYS[3], ARGV[4])
redis.call('PUBLISH', ARGV[6], ARGV[1])
return 1
"""

#: KEYS: queue, running. ARGV: now_ms, lease_ms, in-progress prefix, in-progress ttl ms.
#: Moves the lowest-scored id from the queue to the running set; returns {id, score}.
CLAIM = """
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #head == 0 then
  return false
end
redis.call('ZREM', KEYS[1], head[1])
redis.call('ZADD', KEYS[2], tonumber(ARGV[1]) + tonumber(ARGV[2]), head[1])
redis.call('SET', ARGV[3] .. head[1], '1', 'PX', ARGV[4])
return head
"""

#: KEYS: queue, running. ARGV: id, score. Puts a claimed id back in its old place.
REQUEUE = """
if redis.call('ZREM', KEYS[2], ARGV[1]) == 1 then
  redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
  return 1
end
return 0
"""


#: The arq function name of every llmq job.
JOB_FUNCTION = "generate"


def serialize_job(payload: dict[str, Any], enqueue_ms: int) -> bytes:
    """An arq job record (arq's own field names), as JSON rather than arq's pickle."""
    data: dict[str, Any] = {
        "t": None,
        "f": JOB_FUNCTION,
        "a": [],
        "k": {"payload": payload},
        "et": enqueue_ms,
    }
    return json.dumps(data, separators=(",", ":")).encode()


def serialize(data: dict[str, Any]) -> bytes:
    """arq's serializer hook: JSON, readable by any Redis consumer and safe to load."""
    return json.dumps(data, separators=(",", ":")).encode()


def deserialize(raw: bytes) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(raw)
    return data


def effective_score(arrival_ms: int, priority: int, step_ms: int) -> int:
    """The queue score: arrival shifted by priority; at least 1 (arq ignores 0)."""
    return max(1, arrival_ms + priority * step_ms)


async def queue_depth(redis: Redis, model: str) -> int:
    return cast(int, await redis.zcard(keys.queue(model)))


async def running_count(redis: Redis, model: str) -> int:
    return cast(int, await redis.zcard(keys.running(model)))


def as_str(value: Any) -> str:
    """Redis replies are bytes or str depending on the client; normalise."""
    return value.decode() if isinstance(value, bytes) else str(value)
