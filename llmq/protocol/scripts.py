"""The Lua scripts that make every queue transition atomic: the loader.

Each script is a file in ``llmq/protocol/lua/``, beginning with a named local for every key
and argument; its KEYS and ARGV are built by one builder of the same names
(:mod:`llmq.protocol.slots`). The shared helpers (the lease clock, lease parsing, the fence) live in
``llmq/protocol/lua/clock.lua`` and are prepended to every script when it is read. Files are
read once per process; :func:`scripts_for` registers them once per client. The
values the scripts and Python exchange are encoded and decoded in :mod:`llmq.protocol.codec`.

Every script's keys share one hash slot (:mod:`llmq.protocol.keys`), so that each runs on a
Redis Cluster as on a single Redis: the declared KEYS, and the keys a script builds
from a prefix in ARGV (a job, try or cancel flag of a request claimed from the
queue), all carry the same hash tag. A step that must write two slots is two
calls, ordered so that a crash between them leaves a state someone repairs
(their docstrings in :mod:`llmq.protocol.queue` say which).

A queued request lives in three places, always changed together: the model's
queue (sorted set, score = effective start time), the model's cost hash (prompt +
max_tokens, for token-aware admission) and the model's deadline set (score = queue
deadline in ms).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any
from weakref import WeakKeyDictionary

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

#: Prepended to every script.
HELPERS = "clock"

#: Prepended as well to the scripts that route (and to those that embed one).
ROUTING_HELPERS = "affinity"
ROUTED = frozenset({"claim", "enqueue", "enqueue_batch"})

#: Prepended as well to the scripts that route and to those that keep or drop a
#: request's fair-share entries: fair share among tenants.
FAIR_HELPERS = "fair"
FAIR = ROUTED | {"release", "fair_yield", "cancel", "sweep", "requeue", "reap"}

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
    "record",
    "unrecord",
    "fence",
    "route_beat",
    "metrics_flush",
    "batch_take",
    "batch_result",
    "batch_status",
    "batch_lease",
    "quota_take",
    "quota_return",
    "fair_yield",
    "policy_write",
    "policy_publish",
)

#: Scripts that call another script's text as a local function of their own: the
#: batch runs ``enqueue.lua`` once per request, as ``enqueue_one(KEYS, ARGV)``.
EMBEDS = {"enqueue_batch": ("enqueue_one", "enqueue")}


@cache
def source(name: str) -> str:
    """A script's text, helpers included."""
    folder = resources.files("llmq.protocol") / "lua"
    helpers = (folder / f"{HELPERS}.lua").read_text()
    if name in ROUTED:
        helpers += "\n" + (folder / f"{ROUTING_HELPERS}.lua").read_text()
    if name in FAIR:
        helpers += "\n" + (folder / f"{FAIR_HELPERS}.lua").read_text()
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
    record: AsyncScript
    unrecord: AsyncScript
    fence: AsyncScript
    route_beat: AsyncScript
    metrics_flush: AsyncScript
    batch_take: AsyncScript
    batch_result: AsyncScript
    batch_status: AsyncScript
    batch_lease: AsyncScript
    quota_take: AsyncScript
    quota_return: AsyncScript
    fair_yield: AsyncScript
    policy_write: AsyncScript
    policy_publish: AsyncScript


_REGISTERED: WeakKeyDictionary[Redis, Scripts] = WeakKeyDictionary()


def scripts_for(redis: Redis) -> Scripts:
    """The scripts registered on ``redis`` (registered on first use)."""
    found = _REGISTERED.get(redis)
    if found is None:
        found = Scripts(**{name: redis.register_script(source(name)) for name in NAMES})
        _REGISTERED[redis] = found
    return found


Call = tuple[Sequence[Any], Sequence[Any]]


async def run_pipelined(
    redis: Redis,
    script: AsyncScript,
    calls: Sequence[Call],
    extra: Callable[[Pipeline], None] | None = None,
    also: Sequence[AsyncScript] = (),
) -> list[Any]:
    """Run ``script`` once per (keys, args) of ``calls``, then whatever ``extra`` adds,
    in one non-transactional pipeline (on a cluster, one per node, in parallel).

    By EVALSHA, loading the script (and the scripts ``extra`` runs, ``also``) and
    running the whole pipeline again if Redis lost its script cache (a restart).
    The scripts are loaded together and a cache is lost whole, so then none of the
    pipeline's EVALSHAs ran; its other commands must be ones that may run twice.
    """

    def build() -> Pipeline:
        pipe = redis.pipeline(transaction=False)
        for keys_, args in calls:
            pipe.evalsha(script.sha, len(keys_), *keys_, *args)
        if extra is not None:
            extra(pipe)
        return pipe

    try:
        return await build().execute()
    except NoScriptError:
        for s in (script, *also):
            s.sha = await redis.script_load(s.script)
        return await build().execute()
