"""The pool policy a running process holds, followed within a second.

:class:`LivePolicy` reads the policy once at start-up (seeding it from the process's
environment where the pool has none: :func:`start`), then polls its version every
:data:`POLL_SECONDS` (one ``HGET``) and reads it again when it changed; an API
process and a worker also re-derive, every :data:`DERIVE_SECONDS`, what the model's
workers declare (:mod:`llmq.policy.derived`). The queue asks it, per model, for the routing
and fair share of a claim or an enqueue (and, pool-wide, for the lifetimes of what it
writes, as the worker's publisher does once per flush), and passes its
:attr:`LivePolicy.version` to the claim script, which refuses a version older than
the model's (``lua/claim.lua``): the queue then reads the policy again and claims again.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from redis.asyncio import Redis

from llmq import registry
from llmq.policy import store
from llmq.policy.derived import derive
from llmq.policy.fields import POLICY_NAMES
from llmq.policy.model import Effective, Policy, PolicyError, check_doc
from llmq.protocol import policy as stored_policy
from llmq.protocol.policy import Stored
from llmq.protocol.routing import Routing, routing_from

log = logging.getLogger(__name__)

#: How often a process checks the policy's version.
POLL_SECONDS = 0.25

#: How long a process's start waits for the pool's policy before going on without.
START_SECONDS = 2.0

#: How often an API process or a worker re-derives the values the models' workers declare.
DERIVE_SECONDS = 1.0


class LivePolicy:
    """The policy of every model as this process holds it now."""

    def __init__(self, redis: Redis, *, live_ms: int, derived: bool = False, who: str = "") -> None:
        self.redis = redis
        #: This process, as its log lines name it.
        self.who = who
        self.live_ms = live_ms
        #: Whether this process derives values from the registry (API processes and
        #: workers: a worker claims, and beats its cache for routing, under the derived
        #: routing; a tool reading the policy once need not).
        self.derived = derived
        self.stored = Stored()
        self._declared: dict[str, dict[str, Any]] = {}
        self._effective: dict[str, Effective] = {}
        self._routing: dict[str, Routing] = {}
        self._pool: Policy | None = None
        self._lock = asyncio.Lock()
        #: What to seed the pool's policy with once Redis answers, where it did not
        #: at start-up.
        self.seed: tuple[dict[str, Any], str] | None = None

    @property
    def version(self) -> int:
        return self.stored.version

    def effective(self, model: str) -> Effective:
        found = self._effective.get(model)
        if found is None:
            try:
                found = store.effective_of(self.stored, model, self._declared.get(model, {}))
            except PolicyError:  # a derived value the overrides do not fit: without it
                log.warning("model %r: derived values ignored (they do not fit)", model)
                found = store.effective_of(self.stored, model, {})
            self._effective[model] = found
        return found

    def of(self, model: str) -> Policy:
        return self.effective(model).policy

    def pool(self) -> Policy:
        """The pool-wide policy (without any model's overrides or derived values): read
        once per version, so that a write path may ask for it at every write (the
        lifetimes of what it writes are pool-wide keys)."""
        if self._pool is None:
            self._pool = store.effective_of(self.stored, None, {}).policy
        return self._pool

    def routing_for(self, model: str) -> Routing:
        found = self._routing.get(model)
        if found is None:
            found = self._routing[model] = routing_from(self.of(model), live_ms=self.live_ms)
        return found

    def fairness_for(self, model: str) -> str:
        return self.of(model).fairness

    def fair_slack_for(self, model: str) -> int:
        return self.of(model).fairness_slack_tokens

    async def refresh(self, at_least: int = 0) -> None:
        """Read the policy again (one read at a time: a caller that needs a version
        of at least ``at_least`` finds it read already when another read it)."""
        async with self._lock:
            if at_least and self.version >= at_least:
                return
            self._use(await stored_policy.read(self.redis), self._declared)

    async def derive(self) -> None:
        declared = derive(await registry.live_workers(self.redis, self.live_ms / 1000))
        if declared != self._declared:
            self._use(self.stored, declared)

    def _use(self, stored: Stored, declared: dict[str, dict[str, Any]]) -> None:
        changed = stored.version != self.stored.version
        self.stored, self._declared = stored, declared
        self._effective, self._routing, self._pool = {}, {}, None
        if changed:
            log.info("%s: pool policy version %d", self.who or "process", stored.version)

    async def follow_forever(self) -> None:
        """Poll the version; read the policy when it changed (and re-derive)."""
        ticks = 0
        per_derive = max(1, round(DERIVE_SECONDS / POLL_SECONDS))
        while True:
            try:
                if self.seed is not None:
                    await _start(self, *self.seed)
                    self.seed = None
                if await stored_policy.version(self.redis) != self.version:
                    await self.refresh()
                if self.derived and ticks % per_derive == 0:
                    await self.derive()
            except Exception as exc:  # Redis away: keep the policy held, try again
                log.debug("policy follow: %s", exc)
            ticks += 1
            await asyncio.sleep(POLL_SECONDS)


def explicit(settings: Any) -> dict[str, Any]:
    """The pool policy settings a process's environment or flags set explicitly."""
    return {
        name: getattr(settings, name) for name in POLICY_NAMES if name in settings.model_fields_set
    }


async def start(redis: Redis, settings: Any, who: str, *, derived: bool = False) -> LivePolicy:
    """A process's live policy: the pool's, seeded from this process's explicitly set
    policy settings where the pool has none yet (once, whichever process comes
    first); a process whose settings the pool's policy overrules says once which."""
    live_ms = int(settings.worker_ttl_seconds * 1000)
    live = LivePolicy(redis, live_ms=live_ms, derived=derived, who=who)
    mine = explicit(settings)
    try:
        async with asyncio.timeout(START_SECONDS):
            await _start(live, mine, who)
    except Exception as exc:  # Redis away: its own values until the pool's can be read
        log.warning("pool policy not read (%s); this process's settings hold until it is", exc)
        live._use(Stored(0, check_doc(mine), {}), live._declared)
        live.seed = (mine, who)
    return live


async def _start(live: LivePolicy, mine: dict[str, Any], who: str) -> None:
    # The seed's compare-and-set from version 0 is what makes it once: a pool that
    # has a policy refuses it (one script call per process start).
    if await store.seed(live.redis, mine, who) is not None:
        shown = ", ".join(f"{k}={v}" for k, v in mine.items()) or "nothing set: defaults"
        log.info("pool policy seeded from this process's environment (%s)", shown)
        mine = {}
    await live.refresh()
    # Only a value the pool's differs from is ignored: a process started with the
    # pool's own values (a manifest not yet cleaned up) runs as it was told.
    pool = live.pool()
    ignored = [name for name, value in mine.items() if getattr(pool, name) != value]
    if ignored:
        log.warning(
            "the pool's policy holds other values of these settings; this process's are "
            "ignored (see llmq config show): %s",
            ", ".join(f"LLMQ_{name.upper()}" for name in ignored),
        )
    if live.derived:
        await live.derive()
