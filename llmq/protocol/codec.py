"""Every value that the Lua scripts (``llmq/protocol/lua/``) and Python share, encoded and
decoded here and nowhere else in Python. Each format is documented next to its code;
the Lua side reads or writes the same text.

- lease (``llmq:leases:{m:<model>}`` hash value): ``"score:cost:attempt"``, written by
  claim.lua and enqueue.lua (hand-off), read by renew, requeue, release and reap;
- attached member (``llmq:{g}:attached:<api>``): ``"<id>:<model>"``;
- parked terms (``llmq:parked-terms:{m:<model>}``): ``"free|budget|idle|lease ms|in-progress
  ms|policy version"``, written and read by Lua only (claim.lua, enqueue.lua);
- hand-off message (``llmq:handoff:{m:<model>}:<worker>``): ``"id|score|cost|try|job"``;
- claim reply: ``[id, score, cost, job, try, more, retry ms, matched blocks, overtook, held ms,
  released by, expired..., "|", cancelled...]``;
- route hint (``llmq:routes:{m:<model>}``): ``"priority|session|b1,b2,..."``
  (:class:`RouteHint`), read by claim.lua and enqueue.lua (``lua/affinity.lua``);
- worker load (``llmq:loads:{m:<model>}``): ``"running|capacity|service ms|block us"``
  (:func:`load`);
- routing counters (``llmq:routing:{m:<model>}``): :data:`ROUTING_COUNTERS`;
- renew reply: one of ``ok``/``lost``/``cancelled`` per (id, attempt) pair sent;
- reap reply: ``[id, attempt, id, attempt, ...]``;
- publish writes and reply (see :func:`publish_writes`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from llmq.schema import Event, Lifecycle, TokensEvent, encode_event


def as_str(value: Any) -> str:
    """Redis replies are bytes or str depending on the client; normalise."""
    return value.decode() if isinstance(value, bytes) else str(value)


def as_bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else as_str(value).encode()


@dataclass(frozen=True)
class Lease:
    """A running request's lease: where to requeue it and which attempt holds it."""

    score: int
    cost: int
    attempt: int

    def encode(self) -> str:
        return f"{self.score}:{self.cost}:{self.attempt}"

    @classmethod
    def decode(cls, raw: bytes | str) -> Lease:
        score, cost, attempt = as_str(raw).split(":")
        return cls(int(score), int(cost), int(attempt))


def attached_member(request_id: str, model: str) -> str:
    return f"{request_id}:{model}"


def parse_member(member: bytes | str) -> tuple[str, str]:
    """``(id, model)`` of an attached member; empty strings if malformed."""
    request_id, _, model = as_str(member).partition(":")
    return request_id, model


@dataclass(frozen=True)
class Claim:
    """What one claim attempt found: a request to run, and requests it dropped."""

    request_id: str | None = None
    score: int = 0
    cost: int = 0
    #: The claimed request's job record (None if it expired) and its attempt (arq's
    #: try number, which the claim bumped): the run's fencing token.
    job: bytes | None = None
    attempt: int = 0
    expired: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    #: The queue still held requests after this claim: worth claiming again.
    more: bool = False
    #: A routed claim left requests to the workers that hold their prefix: claim
    #: again in this many ms at the latest, when the first of them is anyone's (0: none).
    retry_ms: int = 0
    #: Of a routed claim under the prefix policy: how many of the request's leading KV
    #: blocks the claimer's cache held (-1: not known).
    matched_blocks: int = -1
    #: The pool policy version the claim was made under (-1: unversioned, or a request
    #: handed to a parked worker at its enqueue).
    policy_version: int = -1
    #: Of a traced claim (-1, "": not known): requests queued ahead of it that it went
    #: before; how long it was left to a busy worker holding its prefix; the guard
    #: that made it anyone's (``guard_wait``, ``guard_overtakes``, ``guard_load``).
    overtook: int = -1
    held_ms: int = -1
    released_by: str = ""


@dataclass(frozen=True)
class FairAnswer:
    """What ``lua/fair_yield.lua`` answered a full worker."""

    #: The candidate to hand back; None: none.
    request_id: str | None
    #: For a no: the one tenant whose requests wait ("": none wait), or None (several,
    #: or not known). No later answer differs for candidates of that tenant until a
    #: request of another is queued (its wake-up names its tenant: :func:`woken_tenant`).
    only: str | None


def parse_fair_answer(reply: Any) -> FairAnswer:
    """``fair_yield.lua``'s reply: a request id, ``=tenant`` (a no, only that tenant's
    requests wait), or false (a no)."""
    answer = as_str(reply) if reply else ""
    if answer.startswith("="):
        return FairAnswer(None, answer[1:])
    return FairAnswer(answer or None, None)


def woken_tenant(message: str) -> str | None:
    """The tenant a wake-up of the model's channel names (``lua/enqueue.lua``: ``id|tenant``);
    None for one that names none (a requeue, a reap)."""
    _, bar, tenant = message.partition("|")
    return tenant if bar else None


def parse_handoff(message: bytes | str) -> Claim:
    """The claim enqueue.lua made for this worker: ``id|score|cost|attempt|job``."""
    request_id, score, cost, attempt, job = as_bytes(message).split(b"|", 4)
    return Claim(
        request_id=request_id.decode(),
        score=int(score),
        cost=int(cost),
        job=job,
        attempt=int(attempt),
    )


class StalePolicy(Exception):
    """A claim refused because the pool policy it was made under is older than the
    model's (``lua/claim.lua``); ``floor``: the model's version."""

    def __init__(self, floor: int) -> None:
        super().__init__(f"policy version below {floor}")
        self.floor = floor


def parse_claim(reply: Sequence[Any]) -> Claim:
    """claim.lua's reply, or :class:`StalePolicy` where it refused the claim."""
    if as_str(reply[0]) == "!stale":
        raise StalePolicy(int(reply[1]))
    request_id, score, cost, job, attempt, more, retry_ms, matched, overtook, held = reply[:10]
    rest = [as_str(x) for x in reply[10:]]
    split = rest.index("|", 1)
    return Claim(
        request_id=as_str(request_id) or None,
        score=int(float(as_str(score))),
        cost=int(float(as_str(cost))),
        job=as_bytes(job) or None,
        attempt=int(attempt),
        expired=rest[1:split],
        cancelled=rest[split + 1 :],
        more=as_str(more) == "1",
        retry_ms=int(retry_ms),
        matched_blocks=int(matched),
        overtook=int(overtook),
        held_ms=int(held),
        released_by=rest[0],
    )


@dataclass(frozen=True)
class RouteHint:
    """What a routed claim knows of a queued request: its priority, its session (a hash
    of ``user`` or ``X-Session-Id``; "" for none) and the names of its prompt's leading
    KV blocks (:mod:`llmq.model.blocks`)."""

    priority: int
    session: str = ""
    blocks: tuple[str, ...] = ()

    def encode(self) -> str:
        return f"{self.priority}|{self.session}|{','.join(self.blocks)}"

    @classmethod
    def decode(cls, raw: bytes | str) -> RouteHint:
        priority, session, blocks = as_str(raw).split("|", 2)
        names = tuple(b for b in blocks.split(",") if b)
        return cls(int(priority), session, names)


def load(running: int, capacity: int, service_ms: int = 0, block_us: int = 0) -> str:
    """A worker's load as routed claims read it: ``"running|capacity|service ms|block
    us"``, the last two its pace (:class:`llmq.protocol.routing.Pace`; 0: unmeasured)."""
    return f"{running}|{capacity}|{service_ms}|{block_us}"


def load_pace(raw: bytes | str) -> tuple[int, int]:
    """The pace (service ms, block us) of a load :func:`load` wrote; 0 for what is not
    measured or not there."""
    fields = [*as_str(raw).split("|"), "0", "0"][2:4]
    service_ms, block_us = (int(f) if f.isdigit() else 0 for f in fields)
    return service_ms, block_us


#: The counters of ``llmq:routing:{m:<model>}`` (HINCRBY by claim.lua and enqueue.lua):
#: ``affinity``, a claim took a request other than the first it could take, for its
#: cache or session; ``held``, a claim left a request to the worker that holds it;
#: ``handoff_affinity``, a hand-off went to a parked worker that wants it more than the
#: first parked, for its cache; ``handoff_held``, an arriving request was queued for a
#: busy holder rather than handed to a parked worker; and one per guard that made a
#: claim (or a hand-off, for ``guard_load``) pass over the worker affinity preferred:
#: ``guard_wait`` (waited past the bound), ``guard_overtakes``
#: (overtaken too often), ``guard_load`` (the holder was far busier), and
#: ``guard_priority`` (a more urgent request ahead kept a cached one out of the window).
ROUTING_COUNTERS = (
    "affinity",
    "held",
    "handoff_affinity",
    "handoff_held",
    "guard_wait",
    "guard_overtakes",
    "guard_load",
    "guard_priority",
)


def parse_routing_stats(raw: Mapping[Any, Any]) -> dict[str, int]:
    """The routing counters, every one present (0 if never counted)."""
    found = {as_str(k): int(v) for k, v in raw.items()}
    return {name: found.get(name, 0) for name in ROUTING_COUNTERS}


#: What a renewal says about one held request.
Renewal = Literal["ok", "lost", "cancelled"]


def fair_entry(tenant: str, weight: float, priority: int) -> str:
    """What ``lua/fair.lua`` keeps of a queued request: ``tenant|weight|priority``."""
    return f"{tenant}|{weight:g}|{priority}"


def renew_args(held: Mapping[str, int]) -> list[str | int]:
    """(id, attempt) pairs, flattened."""
    return [x for rid, attempt in held.items() for x in (rid, attempt)]


def parse_renew(held: Mapping[str, int], reply: Sequence[Any]) -> dict[str, Renewal]:
    out: dict[str, Renewal] = {}
    for rid, raw in zip(held, reply, strict=True):
        news = as_str(raw)
        out[rid] = news if news in ("lost", "cancelled") else "ok"  # type: ignore[assignment]
    return out


def parse_reaped(reply: Sequence[Any]) -> list[tuple[str, int]]:
    """(id, attempt whose lease ran out) pairs."""
    return [(as_str(reply[i]), int(reply[i + 1])) for i in range(0, len(reply) - 1, 2)]


def publish_writes(
    events: Sequence[Event], record: Mapping[str, str], notes: Sequence[Lifecycle]
) -> list[str]:
    """One request's writes as publish.lua reads them after its named slots
    (:class:`llmq.protocol.slots.Publish`, which counts them): per event ``type, data,
    index, count`` (index and count of a ``tokens`` event, else 0 0); record
    field/value pairs; per note ``event, request_id, model, data``. The script's reply
    is 1 (written) or 0 (fenced)."""
    args: list[str] = []
    for event in events:
        encoded = encode_event(event)
        if isinstance(event, TokensEvent):
            args += ("tokens", encoded["data"], str(event.index), str(len(event.tokens)))
        else:
            args += (encoded["type"], encoded["data"], "0", "0")
    for name, value in record.items():
        args += [name, value]
    for note in notes:
        f = note.fields()
        args += [f["event"], f["request_id"], f["model"], f["data"]]
    return args
