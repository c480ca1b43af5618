"""Routing: which queued request a worker claims, which parked worker an arrival goes to.

llmq is a pull queue, so routing is the claim's choice, not a gateway's: each policy
is a small object (:class:`Policy`) whose one name the routed scripts look up in
their table of policies (``lua/affinity.lua``, read by ``lua/claim.lua`` and
``lua/enqueue.lua``), chosen by ``LLMQ_ROUTING`` so that a benchmark runs them side
by side on one stack:

- ``fifo``: today's claim, the lowest score; the scripts run exactly as before,
  nothing extra is written or read.
- ``least-loaded``: a worker leaves a request to a live worker running fewer; the
  hand-off goes to the least loaded parked worker.
- ``hash``: rendezvous hashing of the prompt's first block over the live workers
  (what a simple gateway's consistent hashing does).
- ``prefix``: cache-aware. At admission the API names the prompt's leading KV
  blocks (:func:`llmq.model.blocks.block_hashes`, by the model's tokenizer) and its
  session; workers publish the blocks their cache holds (``lua/route_beat.lua``); a
  worker claims from the queue's first ``window`` requests the one whose prefix it
  holds longest (or whose session it served last), and leaves one that another live
  worker holds longer.

Whatever the policy, the :class:`Guards` bound what affinity may cost: a request
is anyone's once it was held for another worker ``max_wait_ms`` (from the first time
a claim or hand-off left it; queueing that FIFO would impose too does not count) or
``max_overtakes`` later requests were claimed before it; a busy worker is waited for
only while its expected wait for a slot is shorter than recomputing what it holds
elsewhere (the adaptive load guard, from the paces the workers measure,
``worker/pace.py``; or, with ``imbalance`` set, while it runs at most that many
requests beyond the claimer, AIBrix's fixed threshold); no request overtakes a more
urgent one; and a worker that left requests to others is woken when the first of
them becomes anyone's. So no request starves: its wait beyond FIFO's is bounded.
Every process of a deployment must use the same policy (the API writes the hints,
the workers read them).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

from redis.asyncio import Redis

from llmq.model.blocks import block_hashes
from llmq.model.tokenizer import TOKENIZERS, Tokenizer
from llmq.protocol import codec, keys
from llmq.protocol.slots import ClaimRoute, EnqueueRoute

PolicyName = Literal["fifo", "least-loaded", "hash", "prefix"]

#: The scripts' ``imbalance`` for the adaptive load guard (``lua/affinity.lua``).
ADAPTIVE = -1


@dataclass(frozen=True)
class Pace:
    """How fast a worker's engine serves, as the adaptive load guard weighs it
    (``lua/affinity.lua``): ``service_ms``, how long a run holds a slot; ``block_us``,
    how long computing one uncached KV block of a prompt takes. Measured by the worker
    from its own runs (``worker/pace.py``) and published with its load
    (:func:`codec.load`); 0: not measured yet."""

    service_ms: int = 0
    block_us: int = 0


#: A worker's pace before it has measured anything.
UNMEASURED = Pace()


async def paces(redis: Redis, model: str, worker_ids: Sequence[str]) -> list[Pace]:
    """The pace each of ``worker_ids`` last published with its load (its routing beats,
    ``route_beat.lua``): :data:`UNMEASURED` for one that published none (a worker
    under ``fifo`` publishes no load)."""
    if not worker_ids:
        return []
    raw = await cast("Any", redis.hmget(keys.loads(model), list(worker_ids)))
    return [UNMEASURED if r is None else Pace(*codec.load_pace(r)) for r in raw]


@dataclass(frozen=True)
class Policy:
    """A routing policy: its one name (the ``LLMQ_ROUTING`` value, and the scripts'
    key into their table of policies, ``lua/affinity.lua``), how many leading blocks
    of a prompt it needs named (``None``: all there are, up to the routing's
    ``max_blocks``; 0: none) and whether it follows sessions."""

    name: PolicyName
    blocks_named: int | None = 0
    sessions: bool = False

    def blocks(self, limit: int) -> int:
        return limit if self.blocks_named is None else self.blocks_named


#: The lowest score first: today's claim, at today's cost (the scripts route nothing).
FIFO_POLICY = Policy("fifo")

POLICIES: dict[str, Policy] = {
    p.name: p
    for p in (
        FIFO_POLICY,
        # The live worker running fewest requests (a push router's least-requests).
        Policy("least-loaded"),
        # Rendezvous hashing of the prompt's first block: a fixed worker per prefix.
        Policy("hash", blocks_named=1),
        # The worker whose KV cache holds most of the prompt's prefix, or the session's.
        Policy("prefix", blocks_named=None, sessions=True),
    )
}


@dataclass(frozen=True)
class Guards:
    """What bounds affinity (see the module docstring); the defaults are the settings'."""

    window: int = 16
    max_wait_ms: int = 500
    max_overtakes: int = 8
    #: The load guard in running requests (AIBrix's); None: adaptive (the holder's
    #: wait for a slot against recomputing what it holds, :class:`Pace`).
    imbalance: int | None = None
    priority: bool = True
    session_ttl_ms: int = 600_000
    #: Most live workers a routed claim or hand-off compares (bounded cost).
    max_workers: int = 32
    #: A worker whose last beat (lease time) is older than this is not compared: the
    #: registry's ``worker_ttl_seconds``, so its cache is forgotten as it is.
    live_ms: int = 5000

    @property
    def load_guard(self) -> int:
        """``imbalance`` as the scripts take it (:data:`ADAPTIVE` when unset)."""
        return ADAPTIVE if self.imbalance is None else self.imbalance


def session_id(raw: str) -> str:
    """A session's name in Redis: a hash of the client's ``user`` or ``X-Session-Id``
    (any text, never stored as given)."""
    return hashlib.blake2b(raw.encode(), digest_size=8).hexdigest()


@dataclass(frozen=True)
class Routing:
    """A policy with its guards, and what the API and the workers pass the scripts."""

    policy: Policy = FIFO_POLICY
    guards: Guards = Guards()
    #: Most leading blocks of a prompt named at admission (``prefix``).
    max_blocks: int = 256
    tokenizer: Tokenizer = TOKENIZERS["whitespace"]

    @property
    def routed(self) -> bool:
        return self.policy.name != "fifo"

    def hint(
        self,
        prompt: str,
        priority: int,
        session: str | None,
        tokens: Sequence[str] | None = None,
    ) -> str:
        """The route hint of a request ("" under ``fifo``); its blocks are named from
        ``tokens`` where given (its engine's rendering), else from ``prompt`` cut by the
        routing's tokenizer."""
        if not self.routed:
            return ""
        wanted = self.policy.blocks(self.max_blocks)
        if tokens is None:
            tokens = self.tokenizer.tokens(prompt)
        names = block_hashes(tokens, limit=wanted) if wanted else []
        sid = session_id(session) if session and self.policy.sessions else ""
        return codec.RouteHint(priority, sid, tuple(names)).encode()

    def claim_route(self, model: str, *, running: int, capacity: int) -> ClaimRoute | None:
        """The slots a routed claim adds to claim.lua's (none for fifo)."""
        if not self.routed:
            return None
        g = self.guards
        return ClaimRoute(
            routes_key=keys.routes(model),
            overtaken_key=keys.overtaken(model),
            loads_key=keys.loads(model),
            beats_key=keys.beats(model),
            stats_key=keys.routing_stats(model),
            held_key=keys.held(model),
            policy_name=self.policy.name,
            window=g.window,
            max_wait_ms=g.max_wait_ms,
            max_overtakes=g.max_overtakes,
            imbalance=g.load_guard,
            priority_guard="1" if g.priority else "0",
            running=running,
            capacity=capacity,
            cache_prefix=keys.cache_prefix(model),
            session_prefix=keys.session_prefix(model),
            session_ttl_ms=g.session_ttl_ms,
            live_ms=g.live_ms,
            max_workers=g.max_workers,
        )

    def enqueue_route(self, model: str, hint: str) -> EnqueueRoute | None:
        """The slots a routed enqueue adds to enqueue.lua's (none for fifo, or no hint)."""
        if not self.routed or not hint:
            return None
        g = self.guards
        return EnqueueRoute(
            routes_key=keys.routes(model),
            loads_key=keys.loads(model),
            stats_key=keys.routing_stats(model),
            held_key=keys.held(model),
            policy_name=self.policy.name,
            hint_text=hint,
            cache_prefix=keys.cache_prefix(model),
            session_prefix=keys.session_prefix(model),
            session_ttl_ms=g.session_ttl_ms,
            imbalance=g.load_guard,
            max_workers=g.max_workers,
            max_wait_ms=g.max_wait_ms,
            live_ms=g.live_ms,
            now_ms=int(time.time() * 1000),
        )


FIFO = Routing()


def routing_from(settings: Any, live_ms: int | None = None) -> Routing:
    """The routing of a pool policy's fields (``routing`` and its guards: the pool
    policy, :mod:`llmq.policy`, or a process's settings); a worker whose last beat is
    older than ``live_ms`` (default: the settings' ``worker_ttl_seconds``) is not
    compared."""
    if live_ms is None:
        live_ms = int(settings.worker_ttl_seconds * 1000)
    return Routing(
        policy=POLICIES[settings.routing],
        guards=Guards(
            window=settings.routing_window,
            max_wait_ms=settings.routing_max_wait_ms,
            max_overtakes=settings.routing_max_overtakes,
            imbalance=settings.routing_imbalance,
            priority=settings.routing_priority_guard,
            session_ttl_ms=int(settings.routing_session_ttl_seconds * 1000),
            max_workers=settings.routing_workers,
            live_ms=live_ms,
        ),
        max_blocks=settings.routing_blocks,
        tokenizer=TOKENIZERS[settings.routing_tokenizer],
    )
