"""The KEYS and ARGV of every Lua script, named once: one builder per script.

A builder is a frozen dataclass whose fields are the
script's slots in their order, each named as the script's own ``local x = KEYS[n]`` /
``local x = ARGV[n]`` line names it (``tests/test_slots.py`` holds each builder
against its script, so a slot out of order fails a test). A field named ``*_key`` is
a KEY, any other an ARGV; a field made by :func:`tail` (a sequence, always last) is
spread into ARGV (or KEYS) as the variable part the script reads in a loop; a field
holding another builder (a routed claim's or enqueue's extra slots, ``None`` when not
routed) adds its KEYS after these KEYS and its ARGV after these ARGV.
:meth:`Slots.call` flattens a builder into the (KEYS, ARGV) a script call or
:func:`~llmq.protocol.scripts.run_pipelined` takes; :meth:`Slots.run` calls the
builder's script (:attr:`Slots.SCRIPT`).

``publish.lua`` and ``enqueue_batch.lua`` take many requests in one call:
:class:`EnqueueBatch` puts :class:`Enqueue` calls together, and
:func:`llmq.protocol.streams.publish_calls` puts the slots of one request after
another in :class:`Publish`'s order, each request's ARGV after their count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import Field, dataclass, field, fields
from operator import attrgetter
from typing import Any, ClassVar

from llmq.protocol.scripts import Call, Scripts

#: A slot's kind in a layout: a KEY, an ARGV, a tail spread into ARGV or into KEYS, a
#: nested builder.
KEY, ARG, TAIL, KEYS_TAIL, PART = "key", "arg", "tail", "keys_tail", "part"


def tail(*, into: str = TAIL) -> Any:
    """A sequence field spread into ARGV (or, ``into=KEYS_TAIL``, KEYS) after the named
    slots: what the script reads in a loop."""
    return field(default=(), metadata={"kind": into})


def part(cls: type[Slots]) -> dict[str, Any]:
    """The metadata of a field holding ``cls``'s slots, or None: they follow this
    builder's KEYS and ARGV."""
    return {"kind": PART, "part": cls}


@dataclass(frozen=True)
class Layout:
    """A builder's fields by kind, in order, with what reads them off an instance: one
    C call (:func:`operator.attrgetter`) for its named KEYS and one for its named ARGV,
    not a Python loop over its fields."""

    #: (field name, kind) of every field, in order.
    slots: tuple[tuple[str, str], ...]
    #: The named KEYS' and ARGV's values of an instance, as tuples.
    keys: Callable[[Any], tuple[Any, ...]]
    args: Callable[[Any], tuple[Any, ...]]
    #: The fields spread into KEYS or ARGV after the named ones, and the nested builders.
    keys_tails: tuple[str, ...]
    args_tails: tuple[str, ...]
    parts: tuple[str, ...]


def _getter(names: list[str]) -> Callable[[Any], tuple[Any, ...]]:
    """The named attributes of an object, always as a tuple."""
    if len(names) > 1:
        return attrgetter(*names)
    if names:
        one = attrgetter(names[0])
        return lambda obj: (one(obj),)
    return lambda obj: ()


_LAYOUTS: dict[type, Layout] = {}


def layout(cls: type[Slots]) -> Layout:
    """A builder's :class:`Layout` (computed once per class)."""
    found = _LAYOUTS.get(cls)
    if found is None:
        kinds = tuple(
            (f.name, f.metadata.get("kind") or (KEY if f.name.endswith("_key") else ARG))
            for f in fields(cls)
        )
        named = [kind for _, kind in kinds if kind not in (TAIL, KEYS_TAIL, PART)]
        if named != [kind for _, kind in kinds[: len(named)]]:
            raise TypeError(f"{cls.__name__}: a tail or a part comes before a named slot")
        by_kind = {k: [name for name, kind in kinds if kind == k] for k in (KEY, ARG)}
        found = _LAYOUTS[cls] = Layout(
            slots=kinds,
            keys=_getter(by_kind[KEY]),
            args=_getter(by_kind[ARG]),
            keys_tails=tuple(name for name, kind in kinds if kind == KEYS_TAIL),
            args_tails=tuple(name for name, kind in kinds if kind == TAIL),
            parts=tuple(name for name, kind in kinds if kind == PART),
        )
    return found


class Slots:
    """A script's KEYS and ARGV as fields in their order (see the module docstring).

    Not a dataclass itself (it has no fields): each builder is."""

    __slots__ = ()
    #: What :func:`dataclasses.fields` reads of every builder.
    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    #: The script (a field of :class:`~llmq.protocol.scripts.Scripts`) these slots are of.
    SCRIPT: ClassVar[str] = ""

    def call(self) -> Call:
        """The KEYS and ARGV of the script call."""
        keys_: list[Any] = []
        args: list[Any] = []
        self.into(keys_, args)
        return keys_, args

    def into(self, keys_: list[Any], args: list[Any]) -> None:
        """Append the KEYS and ARGV of these slots to a call's (one that carries the
        slots of many requests: :func:`llmq.protocol.streams.publish_calls`)."""
        lay = layout(type(self))
        keys_ += lay.keys(self)
        args += lay.args(self)
        for name in lay.keys_tails:
            keys_ += getattr(self, name)
        for name in lay.args_tails:
            args += getattr(self, name)
        for name in lay.parts:
            part: Slots | None = getattr(self, name)
            if part is not None:
                part.into(keys_, args)

    @classmethod
    def names(cls) -> tuple[list[str], list[str]]:
        """The named KEYS and ARGV slots in order, parts included (what the script's
        ``local`` lines name); a spread tail has no name of its own."""
        slots_ = layout(cls).slots
        keys_ = [name for name, kind in slots_ if kind == KEY]
        args = [name for name, kind in slots_ if kind == ARG]
        for p in (f.metadata["part"] for f in fields(cls) if f.metadata.get("kind") == PART):
            k, a = p.names()
            keys_ += k
            args += a
        return keys_, args

    async def run(self, scripts: Scripts) -> Any:
        """Call the script with these slots."""
        keys_, args = self.call()
        return await getattr(scripts, self.SCRIPT)(keys=keys_, args=args)


@dataclass(frozen=True)
class ClaimRoute(Slots):
    """What a routed claim adds to :class:`Claim` (absent under ``fifo``)."""

    routes_key: str
    overtaken_key: str
    loads_key: str
    beats_key: str
    stats_key: str
    held_key: str
    policy_name: str
    window: int
    max_wait_ms: int
    max_overtakes: int
    imbalance: int
    priority_guard: str
    running: int
    capacity: int
    cache_prefix: str
    session_prefix: str
    session_ttl_ms: int
    live_ms: int
    max_workers: int


@dataclass(frozen=True)
class Claim(Slots):
    """``claim.lua``: take the next request for a worker (or park it)."""

    SCRIPT: ClassVar[str] = "claim"

    queue_key: str
    running_key: str
    costs_key: str
    deadlines_key: str
    leases_key: str
    parked_key: str
    terms_key: str
    clock_key: str
    fair_key: str
    vtc_key: str
    tenants_key: str
    deadline_now: int
    lease_ms: int
    in_progress_prefix: str
    in_progress_ms: int
    budget: int
    idle: str
    job_prefix: str
    cancel_prefix: str
    retry_prefix: str
    retry_ttl: int
    worker_id: str
    free_slots: int
    park_ttl_ms: int
    fairness: str
    fair_slack: int
    fairq_prefix: str
    #: The model's policy version key, and the version of the pool policy the claim
    #: runs under (-1: none held, not checked).
    policy_key: str
    policy_version: int
    #: 1: the worker traces its runs, and the reply says where the request stood.
    traced: int = 0
    route: ClaimRoute | None = field(default=None, metadata=part(ClaimRoute))


@dataclass(frozen=True)
class EnqueueRoute(Slots):
    """What a routed enqueue of a hinted request adds to :class:`Enqueue`."""

    routes_key: str
    loads_key: str
    stats_key: str
    held_key: str
    policy_name: str
    hint_text: str
    cache_prefix: str
    session_prefix: str
    session_ttl_ms: int
    imbalance: int
    max_workers: int
    max_wait_ms: int
    live_ms: int
    now_ms: int


@dataclass(frozen=True)
class Enqueue(Slots):
    """``enqueue.lua``: admit one request, or hand it to a parked worker."""

    SCRIPT: ClassVar[str] = "enqueue"

    queue_key: str
    job_key: str
    costs_key: str
    deadlines_key: str
    parked_key: str
    terms_key: str
    running_key: str
    leases_key: str
    clock_key: str
    beats_key: str
    fair_key: str
    vtc_key: str
    tenants_key: str
    #: The model's policy version key (its floor, lua/policy_publish.lua).
    policy_key: str
    id: str
    score: int
    job: bytes
    ttl_ms: int
    max_depth: int
    wake_channel: str
    cost: int
    deadline_ms: int
    handoff_prefix: str
    in_progress_prefix: str
    retry_prefix: str
    retry_ttl: int
    fair_entry: str
    fairq_prefix: str
    #: The tenant's reservations hash that must hold the request (a single Redis only).
    quota_held: str = ""
    #: The version of the pool policy the caller holds (its routing and fair share);
    #: -1: none (a hand-off is then not checked against the floor).
    policy_version: int = -1
    route: EnqueueRoute | None = field(default=None, metadata=part(EnqueueRoute))


@dataclass(frozen=True)
class EnqueueBatch(Slots):
    """``enqueue_batch.lua``: several :class:`Enqueue` calls, all or none. Its KEYS are
    the calls' KEYS in turn (the first is the model's queue); its ARGV a header (the
    number of calls, ``max_depth``, each call's key and argument counts), then the
    calls' ARGV in turn."""

    SCRIPT: ClassVar[str] = "enqueue_batch"

    calls: Sequence[Enqueue]
    max_depth: int

    def call(self) -> Call:
        all_keys: list[Any] = []
        counts: list[int] = []
        all_args: list[Any] = []
        for one in self.calls:
            keys_, args = one.call()
            all_keys.extend(keys_)
            all_args.extend(args)
            counts.extend((len(keys_), len(args)))
        return all_keys, [len(self.calls), self.max_depth, *counts, *all_args]

    @classmethod
    def names(cls) -> tuple[list[str], list[str]]:
        return ["queue_key"], ["n", "max_depth"]


@dataclass(frozen=True)
class Record(Slots):
    """``record.lua``: a request's ``queued`` record and lifecycle note."""

    SCRIPT: ClassVar[str] = "record"

    record_key: str
    lifecycle_key: str
    ttl_ms: int
    lifecycle_maxlen: int
    id: str
    model: str
    lifecycle_data: str
    #: The record's field/value pairs.
    fields: Sequence[str] = tail()


@dataclass(frozen=True)
class Unrecord(Slots):
    """``unrecord.lua``: undo :class:`Record` for a refused request."""

    SCRIPT: ClassVar[str] = "unrecord"

    record_key: str
    lifecycle_key: str
    note_id: str


@dataclass(frozen=True)
class Requeue(Slots):
    """``requeue.lua``: hand a claimed request back at its original score."""

    SCRIPT: ClassVar[str] = "requeue"

    queue_key: str
    running_key: str
    leases_key: str
    costs_key: str
    fair_key: str
    tenants_key: str
    id: str
    attempt: int
    wake_channel: str
    in_progress_marker: str
    fairq_prefix: str


@dataclass(frozen=True)
class Fence(Slots):
    """``fence.lua``: refuse the writes of attempts below ``lowest``."""

    SCRIPT: ClassVar[str] = "fence"

    fence_key: str
    lowest: int
    ttl: int


@dataclass(frozen=True)
class Release(Slots):
    """``release.lua``: drop the lease of a run that ended."""

    SCRIPT: ClassVar[str] = "release"

    running_key: str
    leases_key: str
    fair_key: str
    vtc_key: str
    id: str
    attempt: int
    #: The tokens the request used (prompt + completion), -1 when not known: its
    #: tenant's fair-share charge is settled to them.
    used: int
    #: Keys deleted when released (a finish's), in the model's slot.
    ended: Sequence[str] = tail(into=KEYS_TAIL)


@dataclass(frozen=True)
class Renew(Slots):
    """``renew.lua``: extend the leases a worker holds, and record its beat."""

    SCRIPT: ClassVar[str] = "renew"

    running_key: str
    leases_key: str
    clock_key: str
    beats_key: str
    lease_ms: int
    cancel_prefix: str
    worker_id: str
    forget_ms: int
    #: (id, attempt) pairs, flat (:func:`llmq.protocol.codec.renew_args`).
    held: Sequence[Any] = tail()


@dataclass(frozen=True)
class Reap(Slots):
    """``reap.lua``: which leases are due, or (with ``fenced``) requeue them."""

    SCRIPT: ClassVar[str] = "reap"

    running_key: str
    queue_key: str
    leases_key: str
    costs_key: str
    clock_key: str
    fair_key: str
    tenants_key: str
    limit: int
    wake_channel: str
    in_progress_prefix: str
    fairq_prefix: str
    #: (id, fenced attempt) pairs, flat: the second call's.
    fenced: Sequence[Any] = tail()


@dataclass(frozen=True)
class RouteBeat(Slots):
    """``route_beat.lua``: a worker's load and what its KV cache gained and lost."""

    SCRIPT: ClassVar[str] = "route_beat"

    cache_key: str
    loads_key: str
    beats_key: str
    worker_id: str
    #: ``codec.load``: running, capacity and pace.
    load: str
    ttl_ms: int
    full: str
    cache_size: int
    n_stored: int
    #: The stored block names, then the evicted ones.
    blocks: Sequence[str] = tail()


@dataclass(frozen=True)
class ApiBeat(Slots):
    """``api_beat.lua``: renew an API process's liveness lease."""

    SCRIPT: ClassVar[str] = "api_beat"

    apis_key: str
    clock_key: str
    process_id: str
    grace_ms: int


@dataclass(frozen=True)
class WorkerBeat(Slots):
    """``worker_beat.lua``: a worker's registry entry and info."""

    SCRIPT: ClassVar[str] = "worker_beat"

    workers_key: str
    info_key: str
    clock_key: str
    worker_id: str
    info: str
    ttl_ms: int
    info_prefix: str


@dataclass(frozen=True)
class Cancel(Slots):
    """``cancel.lua``: remove a queued request, or flag a running one."""

    SCRIPT: ClassVar[str] = "cancel"

    queue_key: str
    costs_key: str
    deadlines_key: str
    job_key: str
    flag_key: str
    routes_key: str
    overtaken_key: str
    held_key: str
    fair_key: str
    id: str
    flag_ttl_ms: int
    cancel_channel: str


@dataclass(frozen=True)
class Orphans(Slots):
    """``orphans.lua``: the attached requests of API processes whose lease ran out."""

    SCRIPT: ClassVar[str] = "orphans"

    apis_key: str
    clock_key: str
    attached_prefix: str
    limit: int


@dataclass(frozen=True)
class Sweep(Slots):
    """``sweep.lua``: remove a model's queued requests past their deadline."""

    SCRIPT: ClassVar[str] = "sweep"

    deadlines_key: str
    queue_key: str
    costs_key: str
    routes_key: str
    overtaken_key: str
    held_key: str
    fair_key: str
    now_ms: int
    limit: int
    job_prefix: str


@dataclass(frozen=True)
class MetricsFlush(Slots):
    """``metrics_flush.lua``: one process's metric deltas with their marker. After the
    named keys come the family hashes (``families``); after the named ARGV the second
    window's pairs, the minute window's count and pairs, and each family's count and
    pairs (``deltas``)."""

    SCRIPT: ClassVar[str] = "metrics_flush"

    marker_key: str
    window_key: str
    minute_key: str
    marker_ttl: int
    window_ttl: int
    minute_ttl: int
    n_window: int
    families: Sequence[str] = tail(into=KEYS_TAIL)
    deltas: Sequence[Any] = tail()


@dataclass(frozen=True)
class Publish(Slots):
    """``publish.lua``'s slots of one request (a call carries many, each after its
    argument count: :func:`llmq.protocol.streams.publish_calls`); the keys are
    :func:`llmq.protocol.keys.run_keys`, the writes
    :func:`llmq.protocol.codec.publish_writes`.

    Not built on the token path: :func:`~llmq.protocol.streams.publish_calls` writes a
    request's slots in this order itself, per request per flush (``tests/test_slots.py``
    holds its order to this one's)."""

    SCRIPT: ClassVar[str] = "publish"

    stream_key: str
    record_key: str
    fence_key: str
    lifecycle_key: str
    attempt: int
    ttl: int
    maxlen: int
    lifecycle_maxlen: int
    n_events: int
    n_record: int
    n_notes: int
    #: Per event ``type, data, index, count``; record pairs; per note four fields.
    writes: Sequence[str] = tail()


@dataclass(frozen=True)
class FairYield(Slots):
    """``fair_yield.lua``: whether a full worker's run gives its slot to another
    tenant's request (:meth:`llmq.protocol.queue.Queue.fair_yield`)."""

    SCRIPT: ClassVar[str] = "fair_yield"

    queue_key: str
    fair_key: str
    vtc_key: str
    tenants_key: str
    leases_key: str
    fairq_prefix: str
    yield_prefix: str
    yield_ms: int
    worker_id: str
    #: The worker's running requests that may give way, the first first.
    candidates: Sequence[str] = tail()


@dataclass(frozen=True)
class QuotaTake(Slots):
    """``quota_take.lua``: take a tenant's quota for the requests of one client request."""

    SCRIPT: ClassVar[str] = "quota_take"

    tpm_key: str
    rpm_key: str
    inflight_key: str
    reserved_key: str
    tpm: int
    rpm: int
    max_concurrent: int
    hold_ms: int
    count: int
    #: (request id, tokens) pairs, flat.
    reservations: Sequence[Any] = tail()


@dataclass(frozen=True)
class QuotaReturn(Slots):
    """``quota_return.lua``: give back an ended request's place and unused tokens."""

    SCRIPT: ClassVar[str] = "quota_return"

    tpm_key: str
    rpm_key: str
    inflight_key: str
    reserved_key: str
    id: str
    used: int


@dataclass(frozen=True)
class BatchTake(Slots):
    """``batch_take.lua``: the next lines of an in-progress batch, now running."""

    SCRIPT: ClassVar[str] = "batch_take"

    batch_key: str
    lines_key: str
    running_key: str
    count: int


@dataclass(frozen=True)
class BatchResult(Slots):
    """``batch_result.lua``: record one line's result, once per ``custom_id``."""

    SCRIPT: ClassVar[str] = "batch_result"

    batch_key: str
    running_key: str
    output_key: str
    errors_key: str
    custom_id: str
    line: str
    #: ``'1'`` for the output file, ``'0'`` for the error file.
    ok: str


@dataclass(frozen=True)
class BatchLease(Slots):
    """``batch_lease.lua``: take or keep the batch feeder's lease, or give it up (``ms`` 0)."""

    SCRIPT: ClassVar[str] = "batch_lease"

    lease_key: str
    holder: str
    ms: int


@dataclass(frozen=True)
class BatchStatus(Slots):
    """``batch_status.lua``: move a batch's status if it is in one of ``since``."""

    SCRIPT: ClassVar[str] = "batch_status"

    batch_key: str
    status: str
    now: int
    #: The statuses it may move from.
    since: Sequence[str] = tail()


@dataclass(frozen=True)
class PolicyWrite(Slots):
    """``policy_write.lua``: change the pool policy if it is still at ``expected``."""

    SCRIPT: ClassVar[str] = "policy_write"

    policy_key: str
    history_key: str
    expected: int
    history_maxlen: int
    who: str
    what: str
    #: field, value, field, value...: a field of the policy hash and its new value
    #: ("" deletes it).
    changes: Sequence[str] = tail()


@dataclass(frozen=True)
class PolicyPublish(Slots):
    """``policy_publish.lua``: raise a model's policy version (its claims' floor)."""

    SCRIPT: ClassVar[str] = "policy_publish"

    version_key: str
    version: int
