"""The pool policy in Redis: its hash, its history, the models' version floors.

The policy (:mod:`llmq.policy`) is one hash in the global slot (``keys.POLICY``): a
``version`` counter, the pool-wide document and each model's overrides, as JSON.
Every change is one ``lua/policy_write.lua`` call, a compare-and-set on the version
that also appends to the capped history stream. After a change the writer raises
each model's version floor (``keys.policy_version``, in the model's slot, where
``lua/claim.lua`` reads it): from then on no claim of that model runs under an older
policy. Documents are validated by the caller before they are written.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from redis.asyncio import Redis

from llmq.protocol import keys, slots
from llmq.protocol.codec import as_str
from llmq.protocol.scripts import run_pipelined, scripts_for

#: Entries the history stream keeps (approximately).
HISTORY_MAXLEN = 1000

POOL = "pool"


@dataclass(frozen=True)
class Stored:
    """The policy as Redis holds it: version 0 and nothing else where none was written."""

    version: int = 0
    pool: dict[str, Any] = field(default_factory=dict)
    models: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def exists(self) -> bool:
        return self.version > 0


@dataclass(frozen=True)
class Change:
    """One entry of the history."""

    version: int
    at_ms: int
    who: str
    what: str


async def read(redis: Redis) -> Stored:
    raw = await cast("Awaitable[dict[Any, Any]]", redis.hgetall(keys.POLICY))
    fields = {as_str(k): as_str(v) for k, v in raw.items()}
    models = {
        name.removeprefix(keys.POLICY_MODEL): json.loads(value)
        for name, value in fields.items()
        if name.startswith(keys.POLICY_MODEL)
    }
    pool = json.loads(fields[POOL]) if POOL in fields else {}
    return Stored(int(fields.get("version", 0)), pool, models)


async def version(redis: Redis) -> int:
    """The policy's version: one small read, what a process polls."""
    raw = await cast("Awaitable[Any]", redis.hget(keys.POLICY, "version"))
    return int(raw) if raw is not None else 0


def model_field(model: str) -> str:
    return keys.POLICY_MODEL + model


async def write(
    redis: Redis,
    expected: int,
    docs: Mapping[str, Mapping[str, Any] | None],
    *,
    who: str,
    what: str,
) -> int | None:
    """Set the documents ``docs`` (hash field -> values; None or empty deletes it) if
    the policy is still at version ``expected``: the new version, or None where
    another change came first (nothing written)."""
    changes: list[str] = []
    for name, doc in docs.items():
        changes += [name, json.dumps(dict(doc), sort_keys=True) if doc else ""]
    done, now = await slots.PolicyWrite(
        policy_key=keys.POLICY,
        history_key=keys.POLICY_HISTORY,
        expected=expected,
        history_maxlen=HISTORY_MAXLEN,
        who=who,
        what=what,
        changes=changes,
    ).run(scripts_for(redis))
    return int(now) if int(done) else None


async def publish(redis: Redis, models: Iterable[str], version: int) -> None:
    """Raise each model's version floor to ``version`` (one round trip)."""
    calls = [
        slots.PolicyPublish(version_key=keys.policy_version(m), version=version).call()
        for m in sorted(set(models))
    ]
    if calls:
        await run_pipelined(redis, scripts_for(redis).policy_publish, calls)


async def known_models(redis: Redis) -> set[str]:
    """Every model a request was queued for (the sweep's list)."""
    raw = await cast("Awaitable[set[Any]]", redis.smembers(keys.MODELS))
    return {as_str(m) for m in raw}


async def history(redis: Redis, count: int) -> list[Change]:
    """The last ``count`` changes, the newest last."""
    raw = await redis.xrevrange(keys.POLICY_HISTORY, count=count)
    out = []
    for entry_id, values in reversed(raw):
        got = {as_str(k): as_str(v) for k, v in values.items()}
        out.append(
            Change(
                int(got.get("version", 0)),
                int(as_str(entry_id).split("-")[0]),
                got.get("who", ""),
                got.get("what", ""),
            )
        )
    return out
