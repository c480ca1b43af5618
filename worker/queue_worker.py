"""An arq worker that claims by priority, on a wake-up signal, one slot at a time;
and the one module where llmq goes around arq.

Stock arq polls every 0.5 s, reads a batch of ids it then starts one by one
(stale while it waits for slots), and keeps running jobs at the head of its
queue. This subclass keeps arq's job machinery (``run_job``: the job function
looked up by name, tries, the job timeout, a cancelled run handed back) and its
public switches (``allow_pick_jobs``, ``max_jobs``, ``ctx``, the ``tasks`` of
running jobs), and replaces how work is found:

- ``main`` waits on a wake-up event (Redis pub/sub from the API, or a slot that
  just freed) and keeps the poll only as a fallback;
- ``_claim_free_slots`` claims one request per free slot (:meth:`Queue.claim`)
  with an atomic script that takes the lowest score, honours the worker's token
  budget, drops requests that are past their deadline or cancelled, moves the
  claimed one to the running set, and reads its job record for ``run_job`` (see
  :class:`ClaimingRedis`); it stops as soon as the queue is empty, and then the
  script *parks* the worker;
- ``take_handoff`` starts a request that the API's enqueue script claimed for
  this parked worker and published on its own channel: at light load a request
  reaches the model in one message from Redis, with no claim round trip;
- ``finish_job`` puts a request that did not finish (worker shutting down) back
  in the queue at its original score (:meth:`Queue.requeue`), and finishes one
  that did (:meth:`Queue.finish`); both only while this run's attempt still holds
  the lease. A run that was fenced (it lost its lease) leaves everything to the
  attempt that owns the request now. A run arq finished without a terminal event
  (its job timeout fired: the runner stops the generation before it, this is the
  backstop) is ended by the runner first, so that its client is answered and the
  request counted once.

Where llmq goes around arq
--------------------------

Every bypass of the worker is in this module; the protocol's side (the job record
and its keys) is named for completeness. Each was checked against arq
:data:`ARQ_CHECKED`, the version pyproject.toml pins: ``tests/test_claimed.py``
fails on any other version, and when arq's ``run_job`` stops reading or finishing
a job the way these rely on. What each buys is measured in docs/benchmarks.md
("arq bypasses"; the polling it replaces in "Light load, pickup and recovery").

1. ``main`` and ``_claim_free_slots`` instead of arq's poll and ``start_jobs``.
   *Why:* claim by priority within a token budget, under a lease, with park and
   hand-off; ``start_jobs`` reads the queue and the global ``arq:in-progress:<id>``
   under one WATCH, two slots on a Redis Cluster. *Buys:* pickup without the poll,
   median queue wait 268 ms -> 1.2 ms at light load. *Re-check:* ``run_job``
   needs nothing arq's ``main`` sets up but ``ctx["redis"]``; ``heart_beat``
   still exists.
2. ``busy_slots`` instead of arq's ``job_counter`` and ``sem``. *Why:* a slot is
   taken by a claim, not by ``start_jobs``, which owns those counters, and given
   back when the run's model is done with it, before the run writes its outcome
   and releases its lease (arq's counters hold it until ``run_job`` returns).
   *Buys:* arq's private counters stay out of llmq, and an inference server's
   slot does not sit idle through a run's last Redis round trips. *Re-check:* arq
   still reads them only in ``start_jobs`` and ``_poll_iteration``, which llmq
   never calls.
3. :class:`ClaimingRedis`: the claim answers ``run_job``'s read. *Why:* the
   claim script read the job record and bumped the try counter (the fencing
   token) atomically; ``run_job`` would read them again, and under arq's key
   names, not the model slot's. *Buys:* one Redis round trip between the claim
   and the model's first step: median queue wait at light load 2.8 ms -> 1.5 ms
   (a loaded machine). *Re-check:* ``run_job``'s first pipeline is GET of the job,
   INCR and EXPIRE of its try counter (the stand-in raises on anything else).
4. ``finish_job`` and ``finish_failed_job``, replaced, not extended. *Why:*
   arq's MULTI names ``arq:job:<id>``, the global ``arq:abort`` set and the
   queue, slots apart, and knows no lease. llmq keeps a request's job, try
   counter and in-progress marker in its model's slot (:mod:`llmq.protocol.keys`),
   deleted by :meth:`Queue.finish` in one command of that slot; nothing of llmq
   is ever in ``arq:abort``, and results are not kept (``keep_result=0``).
   *Buys:* correctness: a Redis Cluster runs it, a fenced run touches nothing, a
   request handed back goes back to the queue at its score (arq would leave it
   in the running set, which the claim moved it to). *Re-check:* ``run_job``
   still ends through these two, with these parameters (mypy checks the
   signatures).
5. The job record written by the enqueue script (:mod:`llmq.protocol`), under
   arq's key prefixes in the model's slot. *Why:* one script queues, admits and
   hands off atomically; ``enqueue_job`` is a WATCH/MULTI of arq's global keys,
   and pickles. *Buys:* admission, priority and hand-off in one step; a record
   any Redis consumer can read. *Re-check:* arq's ``deserialize_job_raw`` still
   reads the fields ``t f a k et``; arq's key prefixes.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from contextvars import ContextVar
from dataclasses import dataclass, replace
from functools import partial
from types import TracebackType
from typing import Any

from arq.connections import ArqRedis
from arq.constants import job_key_prefix, retry_key_prefix
from arq.worker import Worker, func

from llmq import metrics, tracing
from llmq.outage import OUTAGE, Outage
from llmq.protocol import batches, keys
from llmq.protocol.arq_job import JOB_FUNCTION, deserialize, serialize
from llmq.protocol.queue import Claim, Queue, woken_tenant
from llmq.schema import JobPayload
from worker.runner import RequestRunner

log = logging.getLogger(__name__)

#: The arq release every bypass of this module was checked against (the pin).
ARQ_CHECKED = "0.28.0"

#: How long a new claim waits for this process's own older attempt of it to end.
OLDER_ATTEMPT_SECONDS = 5.0

#: How many times a batch line may give its slot to a live request. Each yield is a run
#: (an attempt: the fencing token), so arq's try limit is ``max_tries`` plus this, and
#: :func:`generate` keeps ``max_tries`` for the runs that were not yields.
MAX_YIELDS = 100

#: The attempts of a live request in which it may give its slot to another tenant's
#: (fair share): it gives way at most this many times, then runs to its end.
FAIR_YIELDS = 3


async def generate(ctx: dict[str, Any], payload: dict[str, Any]) -> None:
    """The arq job: validate the payload and hand it to the runner."""
    runner: RequestRunner = ctx["runner"]
    try:
        job = JobPayload.model_validate(payload)
    except ValueError as exc:
        rid = payload.get("request_id") if isinstance(payload, dict) else None
        log.error("skipping malformed job %s: %s", ctx.get("job_id"), exc)
        if isinstance(rid, str):
            await runner.fail(rid, "invalid_job", "the job payload is malformed")
        return
    attempt = int(ctx.get("job_try", 1))
    if (
        attempt > runner.max_tries
        and attempt - await ctx["yields"](job.request_id) > runner.max_tries
    ):
        log.warning("request %s: max %d tries exceeded", job.request_id, runner.max_tries)
        await runner.fail(job.request_id, "job_failed", "the request could not be run")
        return
    await runner.run(job, attempt=attempt)


@dataclass(frozen=True)
class ClaimedJob:
    """What the claim script read for arq: the job record and the attempt (arq's try
    number, bumped by the claim)."""

    request_id: str
    job: bytes | None
    attempt: int


#: The claim of the job that the current task's ``run_job`` is about to read.
_CARRIED: ContextVar[ClaimedJob | None] = ContextVar("llmq_claimed_job", default=None)


def carry(claimed: ClaimedJob) -> None:
    """Give the current task's next ``run_job`` read to ``claimed`` (call it in that task)."""
    _CARRIED.set(claimed)


class _ClaimedRead:
    """Stands in for ``run_job``'s read pipeline; answers from the claim."""

    def __init__(self, claimed: ClaimedJob) -> None:
        self._claimed = claimed
        self._queued: list[str] = []

    async def __aenter__(self) -> _ClaimedRead:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    def _expect(self, command: str, key: Any, wanted: str) -> _ClaimedRead:
        if key != wanted:
            raise RuntimeError(f"arq's run_job read {command} {key!r}; expected {wanted!r}")
        self._queued.append(command)
        return self

    def get(self, key: Any) -> _ClaimedRead:
        return self._expect("GET", key, job_key_prefix + self._claimed.request_id)

    def incr(self, key: Any) -> _ClaimedRead:
        return self._expect("INCR", key, retry_key_prefix + self._claimed.request_id)

    def expire(self, key: Any, seconds: Any) -> _ClaimedRead:
        return self._expect("EXPIRE", key, retry_key_prefix + self._claimed.request_id)

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"arq's run_job queued {name!r}, which the claim did not read")

    async def execute(self) -> list[Any]:
        if self._queued != ["GET", "INCR", "EXPIRE"]:
            raise RuntimeError(f"arq's run_job read {self._queued}; the claim read GET/INCR/EXPIRE")
        return [self._claimed.job, self._claimed.attempt, True]


class ClaimingRedis(ArqRedis):
    """The worker's arq pool: a carried claim answers ``run_job``'s first pipeline.

    arq's ``run_job`` starts by reading the job record and bumping its try counter
    in one pipeline. The claim script did both in its own atomic step, so the
    worker runs each ``run_job`` in a context that carries the claim
    (:func:`carry`), and this pool answers that one pipeline from it. Every other
    command, and any pipeline of a task that carries no claim, goes to Redis.

    The stand-in accepts exactly the commands arq's ``run_job`` queues (GET of the
    job, INCR and EXPIRE of its try counter, under arq's own key names) and fails
    loudly on anything else, so an arq upgrade that changes them cannot silently
    skip a read. Those names are arq's (``arq:job:<id>``), not where llmq keeps the
    job (:func:`llmq.protocol.keys.job`, in the model's slot): with every run
    claimed by the script and :class:`QueueWorker` finishing jobs itself, arq never
    sends them to Redis.
    """

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> Any:
        claimed = _CARRIED.get()
        if claimed is None:
            return super().pipeline(transaction, shard_hint)
        _CARRIED.set(None)  # one read only: later pipelines of the task are real
        return _ClaimedRead(claimed)


class QueueWorker(Worker):
    """An arq ``Worker`` for one model's queue; see the module docstring."""

    def __init__(
        self,
        *,
        model: str,
        worker_id: str = "",
        runner: RequestRunner,
        redis: ClaimingRedis,
        queue: Queue,
        max_jobs: int,
        poll_seconds: float,
        job_timeout: float,
        lease_seconds: float,
        token_budget: int = 0,
        max_tries: int = 3,
    ) -> None:
        super().__init__(
            functions=[func(generate, name=JOB_FUNCTION, max_tries=max_tries + MAX_YIELDS)],
            queue_name=keys.queue(model),
            redis_pool=redis,
            handle_signals=False,
            max_jobs=max_jobs,
            poll_delay=poll_seconds,
            job_timeout=job_timeout,
            keep_result=0,
            max_tries=max_tries + MAX_YIELDS,
            ctx={"runner": runner, "yields": partial(batches.yields, queue.redis)},
            job_serializer=serialize,
            job_deserializer=deserialize,
            log_results=False,
        )
        self.model = model
        self.worker_id = worker_id
        self.runner = runner
        self.queue = queue
        self.lease_ms = int(lease_seconds * 1000)
        self.token_budget = token_budget
        self.wake = asyncio.Event()
        #: A routed claim left requests to other workers: claim again this soon (s).
        self._retry_s: float | None = None
        self._claims: dict[str, tuple[int, int]] = {}  # id -> (cost, attempt)
        #: The runs holding a slot, by (id, attempt): started, and their model not done
        #: with them yet (arq's ``job_counter`` belongs to its ``start_jobs``, which this
        #: worker never calls). A run gives its slot back when its model is done, not
        #: when its task ends: writing the outcome and releasing the lease take Redis
        #: round trips the model's slot (an inference server's) would sit idle through.
        self._slots: set[tuple[str, int]] = set()
        #: The one tenant whose requests waited at the last ``fair_yield.lua`` no (""
        #: none; None: ask again): a full worker whose runs are all that tenant's asks
        #: again only after a wake-up names another. The tenants wake-ups named since
        #: the last question was asked (its answer is stale if they hold another).
        self._fair_only: str | None = None
        self._fair_heard: set[str | None] = set()
        runner.on_model_done = self._free_slot
        #: Set once an operator drained this worker (:meth:`drain`): it never claims again.
        self.draining = False

    def woken(self, message: str) -> None:
        """A wake-up of the model's channel (a request queued, requeued or reaped):
        claim, and ask fair share again unless it names the tenant alone waiting."""
        tenant = woken_tenant(message)
        if tenant != self._fair_only:
            self._fair_only = None
        self._fair_heard.add(tenant)
        self.wake.set()

    @property
    def busy_slots(self) -> int:
        """Slots taken: runs started whose model is not done with them yet."""
        return len(self._slots)

    @property
    def held(self) -> dict[str, int]:
        """The requests this worker holds, with the attempt (fencing token) of each."""
        return {rid: attempt for rid, (_, attempt) in self._claims.items()}

    @property
    def tokens_in_use(self) -> int:
        return sum(cost for cost, _ in self._claims.values())

    async def main(self) -> None:
        """Claim work whenever woken; the poll delay is only the fallback timer."""
        self.ctx["redis"] = self.pool
        outage = Outage(
            log,
            lost="claiming failed (%s); retrying",
            back="claiming works again after %d failed polls",
        )
        while True:
            self.wake.clear()
            try:
                await self._claim_free_slots()
                await self._yield_to_live()
                await self._yield_to_fair_share()
            except OUTAGE as exc:
                # Redis is away: keep the running requests, retry claiming with the
                # backoff every retry uses; one warning per outage, not per retry.
                await outage.failed(exc)
                continue
            outage.recovered()
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel that
            # races with the event being set, and this loop would never stop.
            delay = self.poll_delay_s
            if self._retry_s is not None:
                delay, self._retry_s = min(delay, self._retry_s), None
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self.wake.wait()

    async def _claim_free_slots(self) -> None:
        while self.allow_pick_jobs and self.busy_slots < self.max_jobs:
            claim = await self.queue.claim(
                self.model,
                lease_ms=self.lease_ms,
                in_progress_ms=int(self.in_progress_timeout_s * 1000),
                budget_left=self.token_budget - self.tokens_in_use if self.token_budget else None,
                idle=not self._claims,
                worker_id=self.worker_id,
                free_slots=self.max_jobs - self.busy_slots,
                capacity=self.max_jobs,
                end_dropped=True,
                traced=tracing.enabled(),
            )
            if claim.request_id is None:
                if claim.retry_ms:  # left to the workers holding them, for now
                    self._retry_s = claim.retry_ms / 1000
                break
            await self._take(claim)
            if not claim.more:
                break  # the queue is empty (and this worker parked, if a slot is free)
        for job_id, task in list(self.tasks.items()):
            if task.done():
                del self.tasks[job_id]
                task.result()
        await self.heart_beat()

    async def _yield_to_live(self) -> None:
        """Every slot is taken and live requests wait: hand back a batch line for each
        (one worker per live request, :func:`batches.yield_for`); it goes back to the
        batch band at its score, and resumes later from its last published token."""
        running = self.runner.batch_lines
        if self.busy_slots < self.max_jobs or not running:
            return
        lines = [
            rid
            for rid, (_, attempt) in self._claims.items()
            if rid in running and attempt < MAX_YIELDS
        ]
        count = await batches.yield_for(self.queue.redis, self.model, self.worker_id, len(lines))
        for rid in lines[-count:] if count else ():
            await batches.note_yield(self.queue.redis, rid)
            self.runner.metrics.inc(metrics.BATCH_LINES, self.model, "yielded")
            log.info(
                "batch line %s gives its slot to a live request", rid, extra={"request_id": rid}
            )
            self.runner.hand_back(rid)

    async def _yield_to_fair_share(self) -> None:
        """Every slot is taken and fair share would serve another tenant next: hand back
        a run of a tenant that holds more of the pool than its share (the one that
        produced least, whose restart costs least; ``lua/fair_yield.lua``). It goes back
        to the queue at its place and resumes later from its last published token.
        Not asked again while nothing could change the answer: the last one said only
        one tenant's requests wait (or none), every candidate is that tenant's, and no
        wake-up named another since."""
        if self.busy_slots < self.max_jobs:
            return
        produced, batch = self.runner.produced(), self.runner.batch_lines
        candidates = sorted(
            (
                rid
                for rid, (_, attempt) in self._claims.items()
                if rid in produced and rid not in batch and attempt <= FAIR_YIELDS
            ),
            key=produced.__getitem__,
        )
        only = self._fair_only
        if only == "" or (only is not None and self.runner.all_of(candidates, only)):
            return
        self._fair_heard.clear()
        answer = await self.queue.fair_answer(self.model, self.worker_id, candidates)
        if answer.only is not None and self._fair_heard <= {answer.only}:
            self._fair_only = answer.only  # no wake-up for another tenant meanwhile
        rid = answer.request_id
        if rid is None:
            return
        await batches.note_yield(self.queue.redis, rid)
        self.runner.metrics.inc(metrics.FAIR_YIELDS, self.model)
        log.info(
            "request %s gives its slot to another tenant's (fair share)",
            rid,
            extra={"request_id": rid},
        )
        self.runner.hand_back(rid)

    async def _take(self, claim: Claim) -> None:
        assert claim.request_id is not None
        if not await self._older_attempt_ended(claim):
            return
        self._start(claim)

    async def _older_attempt_ended(self, claim: Claim) -> bool:
        """End this process's own older attempt of ``claim``'s request, if one still runs.

        It happens when this worker was stopped (SIGSTOP, a long pause) while it held
        the request: the lease ran out, the request was requeued, and this worker
        claimed it again. The older attempt is fenced already (the reaper raised its
        fence), and runs are keyed by request id here and in arq: both at once would
        overwrite each other's state. So the older one is stopped and awaited first;
        if it does not end in time, the new claim goes back to the queue.
        """
        rid = claim.request_id
        assert rid is not None
        older = self.tasks.get(rid)
        if older is None or older.done():
            return True
        self.runner.fence(rid, "this worker claimed a later attempt of it")
        await asyncio.wait({older}, timeout=OLDER_ATTEMPT_SECONDS)
        if older.done():
            return True
        await self.queue.requeue(self.model, rid, claim.attempt)
        log.warning(
            "request %s handed back: an older attempt still runs here",
            rid,
            extra={"request_id": rid},
        )
        return False

    async def drain(self) -> None:
        """An operator drained this worker: it claims nothing more and leaves the park
        (so no hand-off comes); its runs go on to their end."""
        if self.draining:
            return
        self.draining = True
        self.allow_pick_jobs = False
        log.info("worker %s drained by an operator: claiming stops", self.worker_id)
        await self.queue.unpark(self.model, self.worker_id)
        if self.queue.routing_for(self.model).routed:
            await self.queue.forget_worker(self.model, self.worker_id)

    async def take_handoff(self, claim: Claim) -> None:
        """Run a request claimed for this worker by the enqueue script.

        A worker that cannot take it (stopping, or its slots filled meanwhile by a
        claim that crossed the hand-off) puts it back in the queue at once.
        """
        if self.queue.policy is not None:  # the enqueue's claim: the policy this worker holds
            claim = replace(claim, policy_version=self.queue.policy.version)
        if claim.request_id is None:
            return
        if self.allow_pick_jobs and self.busy_slots < self.max_jobs:
            await self._take(claim)
            return
        await self.queue.requeue(self.model, claim.request_id, claim.attempt)
        log.info(
            "request %s handed back: no free slot",
            claim.request_id,
            extra={"request_id": claim.request_id},
        )

    def _start(self, claim: Claim) -> None:
        """Run arq's ``run_job`` for ``claim`` in a task whose read the claim answers."""
        rid = claim.request_id
        assert rid is not None
        self._claims[rid] = (claim.cost, claim.attempt)
        slot = (rid, claim.attempt)
        self._slots.add(slot)
        context = contextvars.copy_context()  # only this run_job's read sees the claim
        context.run(carry, ClaimedJob(rid, claim.job, claim.attempt))
        noted: dict[str, int | str] = {
            name: value
            for name, value in (
                ("llmq.claim.matched_blocks", claim.matched_blocks),
                ("llmq.policy.version", claim.policy_version),
                ("llmq.queue.overtook", claim.overtook),
                ("llmq.routing.held_ms", claim.held_ms),
            )
            if value >= 0
        }
        if claim.released_by:
            noted["llmq.routing.released_by"] = claim.released_by
        if noted:
            context.run(tracing.note_claim, noted)
        task = asyncio.create_task(self.run_job(rid, claim.score), context=context)
        task.add_done_callback(lambda _: self._free_slot(*slot))  # if the model never ran
        self.tasks[rid] = task

    def _free_slot(self, request_id: str, attempt: int) -> None:
        """The run's model is done with it (or its task ended): claim again."""
        if (request_id, attempt) in self._slots:
            self._slots.discard((request_id, attempt))
            self.wake.set()

    async def finish_job(
        self,
        job_id: str,
        finish: bool,
        result_data: bytes | None,
        result_timeout_s: float | None,
        keep_result_forever: bool,
        incr_score: int | None,
        keep_in_progress: float | None,
    ) -> None:
        if self.runner.lost(job_id):
            # Lost to another attempt: arq's bookkeeping (delete the job, drop it from
            # the queue) would now hit the request that attempt runs or has requeued.
            self._claims.pop(job_id, None)
            return
        if finish:
            await self.runner.end_unfinished(job_id)
            await self._finish(job_id)
        else:
            self.runner.forget(job_id)  # handed back: a later run ends it
            await self._hand_back(job_id)

    async def finish_failed_job(self, job_id: str, result_data: bytes | None) -> None:
        await self._finish(job_id)
        await self.runner.fail(job_id, "job_failed", "the request could not be run")

    async def _finish(self, job_id: str) -> None:
        claim = self._claims.pop(job_id, None)
        used = self.runner.take_used(job_id)
        await self.queue.finish(self.model, job_id, None if claim is None else claim[1], used)

    async def _hand_back(self, job_id: str) -> None:
        claim = self._claims.pop(job_id, None)
        if claim is not None and await self.queue.requeue(self.model, job_id, claim[1]):
            log.info("request %s handed back to the queue", job_id, extra={"request_id": job_id})
