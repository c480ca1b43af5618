"""Routing: which queued request a worker claims, which parked worker an arrival goes to.

llmq is a pull queue, so routing is the claim's choice, not a gateway's: each policy
is a small object (:class:`Policy`) whose ``mode`` the routed scripts read
(``lua/affinity.lua``, ``lua/claim.lua``, ``lua/enqueue.lua``), chosen by
``LLMQ_ROUTING`` so that a benchmark runs them side by side on one stack:

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
``max_overtakes`` later requests were
claimed before it; a worker busier than the claimer by more than ``imbalance``
running requests is not preferred (AIBrix's threshold, 8); no request overtakes a
more urgent one; and a worker that left requests to others is woken when the first
of them becomes anyone's. So no request starves: its wait beyond FIFO's is bounded.
Every process of a deployment must use the same policy (the API writes the hints,
the workers read them).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from llmq.model.blocks import block_hashes
from llmq.model.tokenizer import TOKENIZERS, Tokenizer
from llmq.protocol import codec, keys

PolicyName = Literal["fifo", "least-loaded", "hash", "prefix"]


class Policy(Protocol):
    """A routing policy: its name, its mode in the scripts ("" for none), and how many
    leading blocks of a prompt it needs named (0: none) and whether it uses sessions."""

    @property
    def name(self) -> str: ...

    @property
    def mode(self) -> str: ...

    def blocks(self, limit: int) -> int: ...

    @property
    def sessions(self) -> bool: ...


@dataclass(frozen=True)
class Fifo:
    """The lowest score first: today's claim, at today's cost."""

    name: str = "fifo"
    mode: str = ""
    sessions: bool = False

    def blocks(self, limit: int) -> int:
        return 0


@dataclass(frozen=True)
class LeastLoaded:
    """The live worker running fewest requests (a push router's least-requests)."""

    name: str = "least-loaded"
    mode: str = "load"
    sessions: bool = False

    def blocks(self, limit: int) -> int:
        return 0


@dataclass(frozen=True)
class FirstBlockHash:
    """Rendezvous hashing of the prompt's first block: a fixed worker per prefix."""

    name: str = "hash"
    mode: str = "hash"
    sessions: bool = False

    def blocks(self, limit: int) -> int:
        return 1


@dataclass(frozen=True)
class CacheAware:
    """The worker whose KV cache holds most of the prompt's prefix, or the session's."""

    name: str = "prefix"
    mode: str = "prefix"
    sessions: bool = True

    def blocks(self, limit: int) -> int:
        return limit


POLICIES: dict[str, Policy] = {
    p.name: p for p in (Fifo(), LeastLoaded(), FirstBlockHash(), CacheAware())
}


@dataclass(frozen=True)
class Guards:
    """What bounds affinity (see the module docstring); the defaults are the settings'."""

    window: int = 16
    max_wait_ms: int = 500
    max_overtakes: int = 8
    imbalance: int = 8
    priority: bool = True
    session_ttl_ms: int = 600_000
    #: Most live workers a routed claim or hand-off compares (bounded cost).
    max_workers: int = 32
    #: A worker whose last beat (lease time) is older than this is not compared: the
    #: registry's ``worker_ttl_seconds``, so its cache is forgotten as it is.
    live_ms: int = 5000


def session_id(raw: str) -> str:
    """A session's name in Redis: a hash of the client's ``user`` or ``X-Session-Id``
    (any text, never stored as given)."""
    return hashlib.blake2b(raw.encode(), digest_size=8).hexdigest()


@dataclass(frozen=True)
class Routing:
    """A policy with its guards, and what the API and the workers pass the scripts."""

    policy: Policy = Fifo()
    guards: Guards = Guards()
    #: Most leading blocks of a prompt named at admission (``prefix``).
    max_blocks: int = 256
    tokenizer: Tokenizer = TOKENIZERS["whitespace"]

    @property
    def routed(self) -> bool:
        return bool(self.policy.mode)

    def hint(self, prompt: str, priority: int, session: str | None) -> str:
        """The route hint of a request ("" under ``fifo``)."""
        if not self.routed:
            return ""
        wanted = self.policy.blocks(self.max_blocks)
        names = block_hashes(self.tokenizer.tokens(prompt), limit=wanted) if wanted else []
        sid = session_id(session) if session and self.policy.sessions else ""
        return codec.RouteHint(priority, sid, tuple(names)).encode()

    def claim_call(self, model: str, *, running: int, capacity: int) -> tuple[list[str], list[Any]]:
        """The keys and arguments a routed claim adds to claim.lua's (none for fifo)."""
        if not self.routed:
            return [], []
        g = self.guards
        return [
            keys.routes(model),
            keys.overtaken(model),
            keys.loads(model),
            keys.beats(model),
            keys.routing_stats(model),
            keys.held(model),
        ], [
            self.policy.mode,
            g.window,
            g.max_wait_ms,
            g.max_overtakes,
            g.imbalance,
            "1" if g.priority else "0",
            running,
            capacity,
            keys.cache_prefix(model),
            keys.session_prefix(model),
            g.session_ttl_ms,
            g.live_ms,
            g.max_workers,
        ]

    def enqueue_call(self, model: str, hint: str) -> tuple[list[str], list[Any]]:
        """The keys and arguments a routed enqueue adds to enqueue.lua's (none for fifo)."""
        if not self.routed or not hint:
            return [], []
        g = self.guards
        return [
            keys.routes(model),
            keys.loads(model),
            keys.routing_stats(model),
            keys.held(model),
        ], [
            self.policy.mode,
            hint,
            keys.cache_prefix(model),
            keys.session_prefix(model),
            g.session_ttl_ms,
            g.imbalance,
            g.max_workers,
            g.max_wait_ms,
            g.live_ms,
            int(time.time() * 1000),
        ]


FIFO = Routing()


def routing_from(settings: Any) -> Routing:
    """The routing of a process, from its settings (``LLMQ_ROUTING`` and the guards)."""
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
            live_ms=int(settings.worker_ttl_seconds * 1000),
        ),
        max_blocks=settings.routing_blocks,
        tokenizer=TOKENIZERS[settings.routing_tokenizer],
    )
