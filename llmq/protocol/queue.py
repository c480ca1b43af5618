"""The queue: enqueue, claim, requeue, cancel and expire, each one atomic script.

The queue of a model is arq's sorted set, scored by an *effective time*:
``arrival_ms + priority * priority_step_ms`` (never below 1, since arq treats a
score of 0 as "not queued"). Workers always take the lowest score, so equal
priorities are first-in first-out and a lower priority waits at most
``priority * step`` behind later arrivals. A claimed request leaves the queue for
the model's running set (scored by lease expiry), so running requests never sit
at the head of the queue the way they do in stock arq. The scripts themselves are
in ``llmq/protocol/lua/`` (loaded by :mod:`llmq.protocol.scripts`); the values they exchange with
Python are encoded in :mod:`llmq.protocol.codec`, and the job record each queue entry
points to is arq's (:mod:`llmq.protocol.arq_job`).

Leases (running requests, API processes) are set and judged in *lease time*, a
clock kept in Redis that follows Redis's own clock but advances at most 300 ms per
call (``llmq/protocol/lua/clock.lua``): a stall or restart of Redis costs nobody their lease,
while a worker that stopped renewing loses it. The attempt number (arq's try
counter, bumped by each claim) is the fencing token of a run: a reap or hand-back
raises the request's fence past it, and every write of a run is checked against
the fence in the same script that makes it (``publish.lua``).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, cast

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.client import Pipeline

from llmq import metrics
from llmq.protocol import codec, keys, slots
from llmq.protocol.arq_job import RETRY_TTL_SECONDS, job_fields, serialize_job
from llmq.protocol.codec import (
    Claim,
    Renewal,
    StalePolicy,
    as_str,
    parse_handoff,
    woken_tenant,
)
from llmq.protocol.quota import Quota, Verdict, parse_take
from llmq.protocol.routing import FIFO, UNMEASURED, Pace, Routing
from llmq.protocol.scripts import Call, run_pipelined, scripts_for
from llmq.protocol.streams import (
    Lifetimes,
    add_event,
    add_lifecycle,
    add_record,
    published_tokens,
    unstarted_end,
)
from llmq.schema import JobPayload, Lifecycle, RequestRecord
from llmq.tenants import TenantLabels


def effective_score(arrival_ms: int, priority: int, step_ms: int) -> int:
    """The queue score: arrival shifted by priority; at least 1 (arq ignores 0)."""
    return max(1, arrival_ms + priority * step_ms)


#: Where the batch band starts: a batch line's score is this plus its arrival (ms),
#: above the score of any interactive request (arrival + priority * step, a few
#: thousand seconds at most past now), so that workers take a batch line only when no
#: interactive request waits. 14 digits: a score survives Lua's number formatting
#: (``%.14g``) exactly when a script requeues it.
BATCH_BAND_MS = 10**13


#: The priority fair share gives batch lines (``lua/fair.lua``): a band of their own,
#: below every interactive priority, in which tenants' batches share in turn.
BATCH_FAIR_PRIORITY = 2**31


def batch_score(arrival_ms: int) -> int:
    """The queue score of a batch line: first in, first out within the batch band."""
    return BATCH_BAND_MS + arrival_ms


def now_ms() -> int:
    return int(time.time() * 1000)


#: The record fields a request's end reads to return its tenant's quota.
QUOTA_FIELDS = ["tenant", "prompt_tokens", "completion_tokens", "reserved"]

#: How long a worker stays parked without claiming again (its fallback poll renews it).
PARK_TTL_MS = 60_000

#: How long a worker's claim to give way for one waiting request holds: about the time
#: a run takes to stop and its slot to claim again.
FAIR_YIELD_MS = 2000


@dataclass(frozen=True)
class Enqueue:
    """One request to enqueue (see :meth:`Queue.admit` for the fields)."""

    request_id: str
    model: str
    job: bytes
    score: int
    cost: int
    deadline_ms: int
    record: dict[str, str]
    lifecycle: Lifecycle
    attach_to: str | None = None
    #: The route hint (:class:`codec.RouteHint`, encoded; "" when not routed).
    route: str = ""
    #: Its tenant for fair share (:func:`codec.fair_entry`; "" without a tenant).
    fair: str = ""

    @classmethod
    def of(
        cls,
        payload: JobPayload,
        *,
        priority_step_ms: int,
        owner: str | None = None,
        attach_to: str | None = None,
        route: str = "",
        weight: float = 1.0,
        reserved: bool = False,
    ) -> Enqueue:
        """Everything enqueued for a validated job: its arq job record, its score
        (:func:`effective_score`), its cost (prompt + max_tokens, what token-aware
        admission charges), its queue deadline, its ``queued`` record and its
        ``queued`` lifecycle note, all from the payload."""
        enqueued_ms = int(payload.enqueued_at * 1000)
        record = RequestRecord(
            id=payload.request_id,
            model=payload.model,
            status="queued",
            priority=payload.priority,
            created_at=payload.enqueued_at,
            prompt_tokens=payload.prompt_tokens,
            owner=owner,
            tenant=payload.tenant,
            reserved=payload.prompt_tokens + payload.params.max_tokens if reserved else None,
        )
        return cls(
            request_id=payload.request_id,
            model=payload.model,
            job=serialize_job(job_fields(payload), enqueued_ms),
            score=effective_score(enqueued_ms, payload.priority, priority_step_ms),
            cost=payload.prompt_tokens + payload.params.max_tokens,
            deadline_ms=int(payload.queue_deadline * 1000),
            record=record.to_redis(),
            lifecycle=Lifecycle(
                event="queued",
                request_id=payload.request_id,
                model=payload.model,
                ts=payload.enqueued_at,
                priority=payload.priority,
                tenant=payload.tenant,
                prompt_tokens=payload.prompt_tokens,
            ),
            attach_to=attach_to,
            route=route,
            fair=""
            if payload.tenant is None
            else codec.fair_entry(
                payload.tenant,
                weight,
                payload.priority if payload.batch is None else BATCH_FAIR_PRIORITY,
            ),
        )


__all__ = ["Claim", "Enqueue", "Queue", "as_str", "parse_handoff", "woken_tenant"]


@dataclass(frozen=True)
class Admission:
    """What :meth:`Queue.admit` did with the requests of one client request."""

    #: Queued (or handed to a parked worker), all of them; False: none is.
    queued: bool
    #: The tenant's quota take, when one was asked for; not taken: nothing was queued.
    quota: Verdict | None = None


class PolicySource(Protocol):
    """The pool policy a process holds (:class:`llmq.policy.live.LivePolicy`): per
    model, the routing and fair share of its claims and enqueues, and the version
    they run under; pool-wide, the lifetimes of what it writes."""

    @property
    def version(self) -> int: ...

    def pool(self) -> Lifetimes: ...

    def routing_for(self, model: str) -> Routing: ...

    def fairness_for(self, model: str) -> str: ...

    def fair_slack_for(self, model: str) -> int: ...

    async def refresh(self, at_least: int = 0) -> None: ...


#: Claims refused as stale in a row before a claim gives up (each reads the policy).
STALE_RETRIES = 5


class Queue:
    """Typed calls of the queue scripts on one Redis client (str or bytes replies)."""

    def __init__(
        self,
        redis: Redis,
        *,
        stream_maxlen: int,
        ttl_seconds: int,
        tally: metrics.Tally | None = None,
        lifecycle_maxlen: int = 100_000,
        routing: Routing = FIFO,
        fairness: str = "fifo",
        fair_slack: int = 0,
        policy: PolicySource | None = None,
    ) -> None:
        self.redis = redis
        #: The pool policy, per model (:mod:`llmq.policy`); None: ``routing``,
        #: ``fairness``, ``fair_slack`` and the lifetimes given here for every model,
        #: and claims unversioned.
        self.policy = policy
        #: The routing policy of claims and hand-offs (:mod:`llmq.protocol.routing`).
        self.routing = routing
        #: ``fifo`` or ``vtc``: fair share among tenants in a claim (``lua/fair.lua``).
        self.fairness = fairness
        self.fair_slack = fair_slack
        self._lifecycle_maxlen = lifecycle_maxlen
        #: Counts the outcome of requests that end without starting (cancelled, timeout).
        self.tally = tally
        self._stream_maxlen = stream_maxlen
        self._ttl = ttl_seconds
        self.scripts = scripts_for(redis)
        self.quota = Quota(redis)
        self.tenant_labels = TenantLabels(redis)
        #: Models this process queued requests for: swept even if ``keys.MODELS`` is lost.
        self.models: set[str] = set()

    def routing_for(self, model: str) -> Routing:
        """The routing of ``model``'s claims and enqueues."""
        return self.routing if self.policy is None else self.policy.routing_for(model)

    def fairness_for(self, model: str) -> str:
        return self.fairness if self.policy is None else self.policy.fairness_for(model)

    def fair_slack_for(self, model: str) -> int:
        return self.fair_slack if self.policy is None else self.policy.fair_slack_for(model)

    @property
    def ttl(self) -> int:
        """Lifetime of a request's keys, in seconds: the pool policy's at this write."""
        return self._ttl if self.policy is None else self.policy.pool().request_ttl_seconds

    @property
    def stream_maxlen(self) -> int:
        return self._stream_maxlen if self.policy is None else self.policy.pool().stream_maxlen

    @property
    def lifecycle_maxlen(self) -> int:
        if self.policy is None:
            return self._lifecycle_maxlen
        return self.policy.pool().lifecycle_maxlen

    async def admit(
        self, calls: list[Enqueue], max_depth: int, quota: slots.QuotaTake | None = None
    ) -> Admission:
        """Enqueue the requests of one client request (one model's), all or none: one by
        ``enqueue.lua``, several by ``enqueue_batch.lua``. Not queued: the queue is full
        (a hand-off counts as queued), or ``quota`` (the tenant's quota take for them) was
        not taken, which :attr:`Admission.quota` says.

        Three slots are written, in this order (see :mod:`llmq.protocol.keys`): the
        tenant's slot (the quota take) with the global slot (attached set) and the
        request's slot (record and ``queued`` note, ``llmq/protocol/lua/record.lua``) in
        one round trip, then the model's slot (queue, job, hand-off), only once the quota
        is taken. On a single Redis a lone request's steps all go in one pipeline on one
        connection, which runs them in that order in one round trip: ``enqueue.lua``
        checks that the quota take left the request's reservation (``quota_held``) before
        it writes anything. A cluster client waits for the first round trip before it
        sends the last (its pipelines run per node, in parallel), as do the several
        requests of one client request.

        If the queue is empty and a worker is parked, a lone request is handed to that
        worker instead of queued (see ``llmq/protocol/lua/enqueue.lua``). ``attach_to``
        (an API process id) ties the request to that process's liveness: if the process
        dies before it calls :meth:`detach`, the sweep cancels the request (see
        :meth:`cancel_orphans`). Before the last step nobody can run or see the request:
        the API has not answered with its id, and no worker can claim it. So a crash
        between the steps leaves a record and a note nobody asks about (the record
        expires with its TTL), a reservation whose hold lapses, and at worst an attached
        member of a request that does not exist, whose cancel by the orphan sweep only
        sets a flag that expires. Once the model step admits the request, its record
        already holds the fields a worker's first write adds to, and its ``queued`` note
        comes before the run's notes. A request not queued has its record, note and
        attached member deleted again (its quota is the caller's to give back).
        """
        one = len(calls) == 1
        if one and not isinstance(self.redis, RedisCluster):  # one round trip
            held = "" if quota is None else quota.reserved_key
            enqueue = self._enqueue_slots(calls[0], max_depth, quota_held=held)
            notes, verdict, reply = await self._record(calls, quota, then=enqueue.call())
            queued = int(reply) in (1, 2)
        else:  # other nodes, or several: the record and the quota land first
            notes, verdict, _ = await self._record(calls, quota)
            queued = False
            if verdict is None or verdict.taken:
                if one:
                    step: slots.Slots = self._enqueue_slots(calls[0], max_depth)
                else:
                    step = slots.EnqueueBatch(
                        [self._enqueue_slots(c, max_depth) for c in calls], max_depth
                    )
                queued = bool(int(await step.run(self.scripts)))
        if not queued:
            await self._unrecord(calls, notes)
        return Admission(queued, verdict)

    async def _record(
        self, calls: list[Enqueue], quota: slots.QuotaTake | None = None, then: Call | None = None
    ) -> tuple[list[str], Verdict | None, Any]:
        """The requests' records and ``queued`` notes, their attached members and the
        ``quota`` take, in one round trip; returns the notes' entry ids, the take's
        verdict (None without one) and the reply of ``then``. Also makes the model
        known to the deadline sweep (once per process and model). ``then``: the KEYS
        and ARGV of an enqueue script call to make after them in the same pipeline (on
        one connection, so in that order)."""
        model = calls[0].model
        if model not in self.models:
            await cast("Awaitable[int]", self.redis.sadd(keys.MODELS, model))
            self.models.add(model)
        script = self.scripts.record
        calls_ = [
            slots.Record(
                record_key=keys.request(c.request_id),
                lifecycle_key=keys.lifecycle(c.request_id),
                ttl_ms=self.ttl * 1000,
                lifecycle_maxlen=self.lifecycle_maxlen,
                id=c.request_id,
                model=c.model,
                lifecycle_data=c.lifecycle.model_dump_json(exclude_none=True),
                fields=[x for kv in c.record.items() for x in kv],
            ).call()
            for c in calls
        ]
        attach_to = calls[0].attach_to

        def extra(pipe: Pipeline) -> None:
            if attach_to:
                members = [keys.attached_member(c.request_id, c.model) for c in calls]
                pipe.sadd(keys.attached(attach_to), *members)
            if quota is not None:
                quota_keys, quota_args = quota.call()
                pipe.evalsha(self.scripts.quota_take.sha, len(quota_keys), *quota_keys, *quota_args)
            if then is not None:
                pipe.evalsha(self.scripts.enqueue.sha, len(then[0]), *then[0], *then[1])

        replies = await run_pipelined(
            self.redis, script, calls_, extra, also=(self.scripts.enqueue, self.scripts.quota_take)
        )
        notes = [as_str(r) for r in replies[: len(calls)]]
        verdict = None
        if quota is not None:
            verdict = parse_take(replies[len(calls) + bool(attach_to)])
        return notes, verdict, replies[-1]

    async def _unrecord(self, calls: list[Enqueue], notes: list[str]) -> None:
        """Undo :meth:`_record` for refused requests (``llmq/protocol/lua/unrecord.lua``)."""
        calls_ = [
            slots.Unrecord(
                record_key=keys.request(c.request_id),
                lifecycle_key=keys.lifecycle(c.request_id),
                note_id=note,
            ).call()
            for c, note in zip(calls, notes, strict=True)
        ]
        attach_to = calls[0].attach_to

        def extra(pipe: Pipeline) -> None:
            if attach_to:
                members = [keys.attached_member(c.request_id, c.model) for c in calls]
                pipe.srem(keys.attached(attach_to), *members)

        await run_pipelined(self.redis, self.scripts.unrecord, calls_, extra)

    def _enqueue_slots(self, call: Enqueue, max_depth: int, quota_held: str = "") -> slots.Enqueue:
        """The enqueue script's slots for one request (all in the model's slot; on a
        single Redis ``quota_held``, the tenant's reservations, is not)."""
        request_id, model = call.request_id, call.model
        return slots.Enqueue(
            queue_key=keys.queue(model),
            job_key=keys.job(request_id, model),
            costs_key=keys.costs(model),
            deadlines_key=keys.deadlines(model),
            parked_key=keys.parked(model),
            terms_key=keys.parked_terms(model),
            running_key=keys.running(model),
            leases_key=keys.leases(model),
            clock_key=keys.clock(model),
            beats_key=keys.beats(model),
            fair_key=keys.fair(model),
            vtc_key=keys.vtc(model),
            tenants_key=keys.fair_tenants(model),
            policy_key=keys.policy_version(model),
            id=request_id,
            score=call.score,
            job=call.job,
            ttl_ms=self.ttl * 1000,
            max_depth=max_depth,
            wake_channel=keys.wake(model),
            cost=call.cost,
            deadline_ms=call.deadline_ms,
            handoff_prefix=keys.handoff_prefix(model),
            in_progress_prefix=keys.in_progress_prefix(model),
            retry_prefix=keys.retry_prefix(model),
            retry_ttl=RETRY_TTL_SECONDS,
            fair_entry=call.fair if self.fairness_for(model) == "vtc" else "",
            fairq_prefix=keys.fairq_prefix(model),
            quota_held=quota_held,
            policy_version=-1 if self.policy is None else self.policy.version,
            route=self.routing_for(model).enqueue_route(model, call.route),
        )

    async def ahead(self, model: str, score: int) -> int:
        """How many of ``model``'s queued requests run before one of ``score`` (a lower
        score): a request's place just after its enqueue, for its trace."""
        return int(await self.redis.zcount(keys.queue(model), "-inf", f"({score}"))

    async def claim(
        self,
        model: str,
        *,
        lease_ms: int,
        in_progress_ms: int,
        budget_left: int | None,
        idle: bool,
        worker_id: str = "",
        free_slots: int = 0,
        capacity: int = 0,
        end_dropped: bool = False,
        traced: bool = False,
    ) -> Claim:
        """Claim the next request for ``worker_id``, which has ``free_slots`` free.

        A worker that leaves the queue empty with a slot still free is parked, so
        that the next request is handed to it (a ``worker_id`` of "" never parks).
        The script drops the requests it finds past their queue deadline or with
        their cancel flag set; ``end_dropped`` (a worker's claims) also ends them
        (:meth:`end_unstarted`: ``timeout``, ``cancelled``), so that their clients
        get a terminal event although no worker ran them. Under a routing policy
        (:attr:`routing`) the worker, of ``capacity`` slots, takes the request it
        wants most among the queue's head (``llmq/protocol/lua/claim.lua``); the claim
        says when to try again if it left requests to other workers
        (:attr:`Claim.retry_ms`).

        The claim runs under the pool policy's :attr:`policy` version: one the script
        finds older than the model's is refused, and the claim is made again once the
        policy is read again (:class:`~llmq.protocol.codec.StalePolicy`). ``traced``
        (the worker traces its runs): the claim also says where the request stood
        (:attr:`Claim.overtook`, :attr:`Claim.held_ms`, :attr:`Claim.released_by`).
        """
        for _ in range(STALE_RETRIES):
            try:
                claim = await self._claim_once(
                    model,
                    lease_ms=lease_ms,
                    in_progress_ms=in_progress_ms,
                    budget_left=budget_left,
                    idle=idle,
                    worker_id=worker_id,
                    free_slots=free_slots,
                    capacity=capacity,
                    traced=traced,
                )
                break
            except StalePolicy as stale:
                if self.policy is None:
                    raise
                await self.policy.refresh(at_least=stale.floor)
        else:
            return Claim()
        if end_dropped and claim.expired:
            await self.end_unstarted(claim.expired, "timeout")
        if end_dropped and claim.cancelled:
            await self.end_unstarted(claim.cancelled, "cancelled")
        return claim

    async def _claim_once(
        self,
        model: str,
        *,
        lease_ms: int,
        in_progress_ms: int,
        budget_left: int | None,
        idle: bool,
        worker_id: str,
        free_slots: int,
        capacity: int,
        traced: bool,
    ) -> Claim:
        routing = self.routing_for(model)
        version = -1 if self.policy is None else self.policy.version
        reply = await slots.Claim(
            queue_key=keys.queue(model),
            running_key=keys.running(model),
            costs_key=keys.costs(model),
            deadlines_key=keys.deadlines(model),
            leases_key=keys.leases(model),
            parked_key=keys.parked(model),
            terms_key=keys.parked_terms(model),
            clock_key=keys.clock(model),
            fair_key=keys.fair(model),
            vtc_key=keys.vtc(model),
            tenants_key=keys.fair_tenants(model),
            deadline_now=now_ms(),
            lease_ms=lease_ms,
            in_progress_prefix=keys.in_progress_prefix(model),
            in_progress_ms=in_progress_ms,
            budget=-1 if budget_left is None else max(budget_left, 0),
            idle="1" if idle else "0",
            job_prefix=keys.job_prefix(model),
            cancel_prefix=keys.cancel_flag_prefix(model),
            retry_prefix=keys.retry_prefix(model),
            retry_ttl=RETRY_TTL_SECONDS,
            worker_id=worker_id,
            free_slots=free_slots,
            park_ttl_ms=PARK_TTL_MS,
            fairness=self.fairness_for(model),
            fair_slack=self.fair_slack_for(model),
            fairq_prefix=keys.fairq_prefix(model),
            policy_key=keys.policy_version(model),
            policy_version=version,
            traced=1 if traced else 0,
            route=routing.claim_route(
                model, running=max(capacity - free_slots, 0), capacity=capacity
            ),
        ).run(self.scripts)
        return replace(codec.parse_claim(reply), policy_version=version)

    async def fair_yield(self, model: str, worker_id: str, candidates: list[str]) -> str | None:
        """Which of a full worker's running requests (``candidates``, the first to give
        way first) should give its slot to the request of another tenant that fair
        share would serve next (``lua/fair_yield.lua``); None: none."""
        return (await self.fair_answer(model, worker_id, candidates)).request_id

    async def fair_answer(
        self, model: str, worker_id: str, candidates: list[str]
    ) -> codec.FairAnswer:
        """:meth:`fair_yield`'s answer, and for a no whether only one tenant's requests
        wait (:attr:`llmq.protocol.codec.FairAnswer.only`)."""
        if self.fairness_for(model) != "vtc" or not candidates:
            return codec.FairAnswer(None, None)
        found = await slots.FairYield(
            queue_key=keys.queue(model),
            fair_key=keys.fair(model),
            vtc_key=keys.vtc(model),
            tenants_key=keys.fair_tenants(model),
            leases_key=keys.leases(model),
            fairq_prefix=keys.fairq_prefix(model),
            yield_prefix=keys.fair_yield_prefix(model),
            yield_ms=FAIR_YIELD_MS,
            worker_id=worker_id,
            candidates=candidates,
        ).run(self.scripts)
        return codec.parse_fair_answer(found)

    async def unpark(self, model: str, worker_id: str) -> None:
        """Stop handing requests to ``worker_id`` (it is stopping)."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.zrem(keys.parked(model), worker_id)
        pipe.hdel(keys.parked_terms(model), worker_id)
        await pipe.execute()

    async def requeue(self, model: str, request_id: str, attempt: int) -> bool:
        """Hand a claimed request back at its original score; its fence rises past
        ``attempt``. False if ``attempt`` no longer holds the lease.

        The queue (model slot) takes the request back first, then the fence
        (request slot) rises. Only the process running ``attempt`` hands it back,
        so if that process dies between the two, nothing of the attempt writes any
        more; the fence only stops what its publisher still holds, and the next
        attempt's first write raises it as well (``publish.lua``).
        """
        done = await slots.Requeue(
            queue_key=keys.queue(model),
            running_key=keys.running(model),
            leases_key=keys.leases(model),
            costs_key=keys.costs(model),
            fair_key=keys.fair(model),
            tenants_key=keys.fair_tenants(model),
            id=request_id,
            attempt=attempt,
            wake_channel=keys.wake(model),
            in_progress_marker=keys.in_progress(request_id, model),
            fairq_prefix=keys.fairq_prefix(model),
        ).run(self.scripts)
        if done:
            await self.raise_fences([(request_id, attempt)])
        return bool(done)

    async def raise_fences(self, lost: list[tuple[str, int]]) -> None:
        """Fence off each (id, attempt): its writes are refused from now on
        (``llmq/protocol/lua/fence.lua``, one call per request slot, in one round trip)."""
        if lost:
            calls = [
                slots.Fence(fence_key=keys.fence(rid), lowest=attempt + 1, ttl=self.ttl).call()
                for rid, attempt in lost
            ]
            await run_pipelined(self.redis, self.scripts.fence, calls)

    async def release(self, model: str, request_id: str, attempt: int, used: int = -1) -> bool:
        """Drop the lease of a run that ended, if ``attempt`` still holds it; its
        tenant's fair-share charge is settled to ``used`` tokens (-1: not known)."""
        return bool(await self._release_slots(model, request_id, attempt, used).run(self.scripts))

    @staticmethod
    def _release_slots(
        model: str, request_id: str, attempt: int, used: int, ended: Sequence[str] = ()
    ) -> slots.Release:
        return slots.Release(
            running_key=keys.running(model),
            leases_key=keys.leases(model),
            fair_key=keys.fair(model),
            vtc_key=keys.vtc(model),
            id=request_id,
            attempt=attempt,
            used=used,
            ended=ended,
        )

    async def finish(
        self, model: str, request_id: str, attempt: int | None, used: int | None = None
    ) -> None:
        """A run ended for good: :meth:`release` the lease of ``attempt`` and delete
        what arq's own finish would, under llmq's names (the job record, its try
        counter and in-progress marker; a hand-back drops only the marker, in
        ``requeue.lua``), then return the tenant's quota and count its tokens. An
        attempt that no longer holds the lease (its worker stopped or was cut off
        after the run's last write, and the request was reaped) changes nothing: the
        attempt that holds it ends the request, so each is ended and counted once.
        ``attempt`` None (the worker held no lease) ends it unconditionally. Every key
        is in the model's slot, so it is one round trip. ``used``: the prompt +
        completion tokens the run wrote in the record, if the caller knows them."""
        names = [
            keys.job(request_id, model),
            keys.retry(request_id, model),
            keys.in_progress(request_id, model),
        ]

        served = keys.served(model, int(time.time()) // keys.SERVED_PERIOD_SECONDS)

        record = keys.request(request_id)
        # What the request used (its record: the terminal write is in) returns its
        # tenant's quota, read in the same round trip; under fair share the release
        # settles the tenant's charge to it too, so unless the caller says what it
        # was, it is read first.
        usage = None
        if used is None and self.fairness_for(model) == "vtc" and attempt is not None:
            usage = await self.redis.hmget(record, QUOTA_FIELDS)  # type: ignore[misc]
            used = _used(usage)

        def count(pipe: Pipeline) -> None:
            # a stale attempt's finish counts here once more: a rare overcount of a rate
            pipe.incr(served)
            pipe.expire(served, 4 * keys.SERVED_PERIOD_SECONDS)
            if usage is None:
                pipe.hmget(record, QUOTA_FIELDS)

        if attempt is None:
            pipe = self.redis.pipeline(transaction=False)
            pipe.delete(*names)
            if usage is None:
                pipe.hmget(record, QUOTA_FIELDS)
            replies = await pipe.execute()
        else:
            settled = -1 if used is None else used
            calls = [self._release_slots(model, request_id, attempt, settled, names).call()]
            replies = await run_pipelined(self.redis, self.scripts.release, calls, count)
            if not replies[0]:
                return
        await self._give_back(request_id, replies[-1] if usage is None else usage, unstarted=False)

    async def give_back_quota(self, request_ids: list[str], *, unstarted: bool = False) -> None:
        """Return the tenant quota of requests that ended (:mod:`llmq.protocol.quota`),
        read from their records, so it holds whichever process ends them."""
        read = self.redis.pipeline(transaction=False)
        for rid in request_ids:
            read.hmget(keys.request(rid), QUOTA_FIELDS)
        for rid, fields in zip(request_ids, await read.execute(), strict=True):
            await self._give_back(rid, fields, unstarted=unstarted)

    async def _give_back(self, request_id: str, fields: list[Any], *, unstarted: bool) -> None:
        """Return a request's place at once and the tokens it reserved but did not use
        (prompt + completion, as its record says; nothing used by a request that ended
        without starting), if it reserved any; count its tokens for its tenant."""
        tenant, prompt, completion, reserved = fields
        if not tenant:
            return
        name = as_str(tenant)
        used = 0 if unstarted else int(prompt or 0) + int(completion or 0)
        if reserved:
            await self.quota.give_back(name, request_id, used)
        if self.tally is not None and used:
            label = await self.tenant_labels.label(name)
            self.tally.inc(metrics.TENANT_TOKENS, label, amount=used)

    async def renew(
        self, model: str, held: Mapping[str, int], lease_ms: int, worker_id: str = ""
    ) -> dict[str, Renewal]:
        """Extend the leases of ``held`` (id -> attempt) by ``lease_ms`` of lease time,
        and record ``worker_id``'s beat in the model's slot (the hand-off's check).

        Says per request whether it is still this worker's (``ok``), was taken away
        (``lost``: stop it without writing) or cancelled (``cancelled``).
        """
        if not held and not worker_id:
            return {}
        reply = await slots.Renew(
            running_key=keys.running(model),
            leases_key=keys.leases(model),
            clock_key=keys.clock(model),
            beats_key=keys.beats(model),
            lease_ms=lease_ms,
            cancel_prefix=keys.cancel_flag_prefix(model),
            worker_id=worker_id,
            forget_ms=PARK_TTL_MS,
            held=codec.renew_args(held),
        ).run(self.scripts)
        return codec.parse_renew(held, reply)

    async def reap(self, model: str, limit: int = 100) -> list[tuple[str, int]]:
        """Requeue requests whose lease ran out in lease time, fencing off the
        attempts that held them first; returns (id, attempt) pairs.

        Three calls (``llmq/protocol/lua/reap.lua``): which leases are due (model slot), their
        fences raised (each request's slot), then the requeue of those whose lease
        is still that attempt's (model slot). So once a request is back in the
        queue, nothing of the attempt that lost it lands, as when it was one step.
        A crash after the fences leaves fenced attempts whose leases are still due:
        the next sweep reaps them. A sweep with nothing due costs one call.
        """
        reap = slots.Reap(
            running_key=keys.running(model),
            queue_key=keys.queue(model),
            leases_key=keys.leases(model),
            costs_key=keys.costs(model),
            clock_key=keys.clock(model),
            fair_key=keys.fair(model),
            tenants_key=keys.fair_tenants(model),
            limit=limit,
            wake_channel=keys.wake(model),
            in_progress_prefix=keys.in_progress_prefix(model),
            fairq_prefix=keys.fairq_prefix(model),
        )
        due = codec.parse_reaped(await reap.run(self.scripts))
        if not due:
            return []
        await self.raise_fences(due)
        pairs = [x for rid, attempt in due for x in (rid, attempt)]
        return codec.parse_reaped(await replace(reap, fenced=pairs).run(self.scripts))

    async def route_beat(
        self,
        model: str,
        worker_id: str,
        *,
        running: int,
        capacity: int,
        ttl_ms: int,
        stored: list[str],
        evicted: list[str],
        cache_size: int,
        full: bool = False,
        pace: Pace = UNMEASURED,
    ) -> bool:
        """Publish a worker's load and pace, and what its KV cache gained (``stored``) and lost
        (``evicted``) since the last beat (``llmq/protocol/lua/route_beat.lua``); with
        ``full``, ``stored`` is the whole cache. False: the published set is gone
        while it should hold ``cache_size`` blocks already (it expired, or Redis lost
        it): nothing was applied; send the cache whole."""
        done = await slots.RouteBeat(
            cache_key=keys.cache(worker_id, model),
            loads_key=keys.loads(model),
            beats_key=keys.beats(model),
            worker_id=worker_id,
            load=codec.load(running, capacity, pace.service_ms, pace.block_us),
            ttl_ms=ttl_ms,
            full="1" if full else "0",
            cache_size=cache_size,
            n_stored=len(stored),
            blocks=[*stored, *evicted],
        ).run(self.scripts)
        return bool(done)

    async def forget_worker(self, model: str, worker_id: str) -> None:
        """A stopping worker's cache and load stop counting for routing."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(keys.cache(worker_id, model))
        pipe.hdel(keys.loads(model), worker_id)
        await pipe.execute()

    async def routing_stats(self, model: str) -> dict[str, int]:
        """How often routed claims chose by affinity and each guard fired (counters)."""
        raw = await cast("Awaitable[Any]", self.redis.hgetall(keys.routing_stats(model)))
        return codec.parse_routing_stats(raw)

    async def api_beat(self, process_id: str, grace_seconds: float) -> None:
        """Renew an API process's liveness lease: dead ``grace_seconds`` of lease time
        from now (a stall of Redis does not make it look dead)."""
        await slots.ApiBeat(
            apis_key=keys.APIS,
            clock_key=keys.CLOCK,
            process_id=process_id,
            grace_ms=int(grace_seconds * 1000),
        ).run(self.scripts)

    async def api_gone(self, process_id: str) -> None:
        """An API process stops: its lease ends now, so the sweep cancels whatever is
        still attached to it and then forgets it."""
        await self.redis.zadd(keys.APIS, {process_id: 0})

    async def backlog(self, model: str, score: int, periods: int) -> tuple[int, int]:
        """What waits in ``model``'s queue at or below ``score``, and how many of its
        requests finished in the last ``periods`` periods of :func:`keys.served` and
        the current one so far (one round trip): the measure of an expected wait."""
        period = int(time.time()) // keys.SERVED_PERIOD_SECONDS
        pipe = self.redis.pipeline(transaction=False)
        pipe.zcount(keys.queue(model), "-inf", score)
        pipe.mget([keys.served(model, period - i) for i in range(periods + 1)])
        ahead, served = cast("tuple[int, list[bytes | str | None]]", tuple(await pipe.execute()))
        return ahead, sum(int(x) for x in served if x is not None)

    async def cancel(self, model: str, request_id: str) -> bool:
        """Cancel a request; True if it was still queued (and is now gone)."""
        was_queued = await slots.Cancel(
            queue_key=keys.queue(model),
            costs_key=keys.costs(model),
            deadlines_key=keys.deadlines(model),
            job_key=keys.job(request_id, model),
            flag_key=keys.cancel_flag(request_id, model),
            routes_key=keys.routes(model),
            overtaken_key=keys.overtaken(model),
            held_key=keys.held(model),
            fair_key=keys.fair(model),
            id=request_id,
            flag_ttl_ms=self.ttl * 1000,
            cancel_channel=keys.cancel_channel(model),
        ).run(self.scripts)
        if was_queued:
            await self.end_unstarted([request_id], "cancelled")
        return bool(was_queued)

    async def detach(self, process_id: str, request_id: str, model: str) -> None:
        """The request's client is done with it: its API process may die in peace."""
        member = keys.attached_member(request_id, model)
        await cast("Awaitable[int]", self.redis.srem(keys.attached(process_id), member))

    async def cancel_orphans(self, limit: int = 100) -> list[str]:
        """Cancel requests attached to API processes that stopped renewing their lease.

        Their clients' connections died with the process and an OpenAI client cannot
        resume, so finishing them would only waste worker slots. Returns their ids.
        """
        reply = await slots.Orphans(
            apis_key=keys.APIS,
            clock_key=keys.CLOCK,
            attached_prefix=keys.ATTACHED_PREFIX,
            limit=limit,
        ).run(self.scripts)
        cancelled = []
        for member in reply:
            request_id, model = codec.parse_member(member)
            if request_id and model:
                await self.cancel(model, request_id)
                cancelled.append(request_id)
        return cancelled

    async def sweep(self, limit: int = 100) -> list[str]:
        """Expire queued requests past their deadline, model by model (each model's
        deadlines are in its slot); returns their ids."""
        known = await cast("Awaitable[set[Any]]", self.redis.smembers(keys.MODELS))
        expired: list[str] = []
        for model in sorted(self.models | {as_str(m) for m in known}):
            reply = await slots.Sweep(
                deadlines_key=keys.deadlines(model),
                queue_key=keys.queue(model),
                costs_key=keys.costs(model),
                routes_key=keys.routes(model),
                overtaken_key=keys.overtaken(model),
                held_key=keys.held(model),
                fair_key=keys.fair(model),
                now_ms=now_ms(),
                limit=limit,
                job_prefix=keys.job_prefix(model),
            ).run(self.scripts)
            expired += [as_str(x) for x in reply]
        await self.end_unstarted(expired, "timeout")
        return expired

    async def end_unstarted(self, request_ids: list[str], reason: str) -> None:
        """Write the terminal event and record of requests ended in the queue: never
        started, or requeued after a run (their usage counts the tokens it published)."""
        if not request_ids:
            return
        read = self.redis.pipeline(transaction=False)
        for rid in request_ids:
            read.hmget(keys.request(rid), ["created_at", "prompt_tokens", "model", "started_at"])
        found = await read.execute()
        write = self.redis.pipeline(transaction=False)
        for rid, (created, prompt_tokens, model, started) in zip(request_ids, found, strict=True):
            published = len(await published_tokens(self.redis, rid)) if started else 0
            if self.tally is not None:
                label = as_str(model) if model else ""
                self.tally.inc(metrics.REQUESTS, label, reason)
            event, record = unstarted_end(
                rid,
                reason,
                queued_since=float(as_str(created)) if created else None,
                prompt_tokens=int(as_str(prompt_tokens)) if prompt_tokens else 0,
                completion_tokens=published,
            )
            add_event(write, rid, event, maxlen=self.stream_maxlen, ttl=self.ttl)
            add_record(write, rid, record, ttl=self.ttl)
            note = Lifecycle(
                event="cancelled" if reason == "cancelled" else "failed",
                request_id=rid,
                model=as_str(model) if model else "",
                ts=time.time(),
                finish_reason=event.finish_reason,  # type: ignore[union-attr]
                completion_tokens=published,
            )
            add_lifecycle(write, note, maxlen=self.lifecycle_maxlen)
        await write.execute()
        await self.give_back_quota(request_ids, unstarted=True)


def _used(usage: list[Any] | None) -> int:
    """Prompt + completion tokens of a record's :data:`QUOTA_FIELDS`; -1: not known."""
    if usage is None:
        return -1
    _, prompt, completion, _ = usage
    return int(prompt or 0) + int(completion or 0) if prompt or completion else -1
