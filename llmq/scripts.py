"""The Lua scripts that make every queue transition atomic: the loader.

Each script is a file in ``llmq/lua/``, beginning with a named local for every key
and argument. The shared helpers (the lease clock, lease parsing, the fence) live in
``llmq/lua/clock.lua`` and are prepended to every script when it is read. Files are
read once per process; :func:`scripts_for` registers them once per client. The
values the scripts and Python exchange are encoded and decoded in :mod:`llmq.codec`.

Keys are passed where a script touches a fixed set of them; scripts that work
across models or requests (the deadline sweep, the fence raised by a reap) build key
names from prefixes, which is fine on a single Redis node.

A queued request lives in three places, always changed together: the model's
queue (sorted set, score = effective start time), the model's cost hash (prompt +
max_tokens, for token-aware admission) and the global deadline set (member
``<id>:<model>``, score = queue deadline in ms).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources
from weakref import WeakKeyDictionary

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

#: Prepended to every script.
HELPERS = "clock"

NAMES = (
    "enqueue",
    "claim",
    "requeue",
    "release",
    "cancel",
    "sweep",
    "renew",
    "reap",
    "orphans",
    "api_beat",
    "worker_beat",
    "publish",
    "enqueue_batch",
)

#: Scripts that call another script's text as a local function of their own: the
#: batch runs ``enqueue.lua`` once per request, as ``enqueue_one(KEYS, ARGV)``.
EMBEDS = {"enqueue_batch": ("enqueue_one", "enqueue")}


@cache
def source(name: str) -> str:
    """A script's text, helpers included."""
    folder = resources.files("llmq") / "lua"
    helpers = (folder / f"{HELPERS}.lua").read_text()
    embedded = ""
    if name in EMBEDS:
        function, body = EMBEDS[name]
        embedded = (
            f"local function {function}(KEYS, ARGV)\n"
            + (folder / f"{body}.lua").read_text()
            + "\nend\n"
        )
    return helpers + "\n" + embedded + (folder / f"{name}.lua").read_text()


@dataclass(frozen=True)
class Scripts:
    """Every script, registered on one client."""

    enqueue: AsyncScript
    claim: AsyncScript
    requeue: AsyncScript
    release: AsyncScript
    cancel: AsyncScript
    sweep: AsyncScript
    renew: AsyncScript
    reap: AsyncScript
    orphans: AsyncScript
    api_beat: AsyncScript
    worker_beat: AsyncScript
    publish: AsyncScript
    enqueue_batch: AsyncScript


_REGISTERED: WeakKeyDictionary[Redis, Scripts] = WeakKeyDictionary()


def scripts_for(redis: Redis) -> Scripts:
    """The scripts registered on ``redis`` (registered on first use)."""
    found = _REGISTERED.get(redis)
    if found is None:
        found = Scripts(**{name: redis.register_script(source(name)) for name in NAMES})
        _REGISTERED[redis] = found
    return found
