"""An arq worker that claims by priority, on a wake-up signal, one slot at a time.

Stock arq polls every 0.5 s, reads a batch of ids it then starts one by one
(stale while it waits for slots), and keeps running jobs at the head of its
queue. This subclass keeps arq's job machinery (``run_job``: tries, timeouts,
cancellation on shutdown) and replaces how work is found:

- ``main`` waits on a wake-up event (Redis pub/sub from the API, or a slot that
  just freed) and keeps the poll only as a fallback;
- ``_poll_iteration`` claims one request per free slot (:meth:`Queue.claim`)
  with an atomic script that takes the lowest score, honours the worker's token
  budget, drops requests that are past their deadline or cancelled, moves the
  claimed one to the running set, and reads its job record for ``run_job`` (see
  :mod:`worker.claimed`); it stops as soon as the queue is empty, and then the
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

arq's own ``finish_job`` and ``finish_failed_job`` are replaced, not extended: they
name arq's keys (``arq:job:<id>``, the global ``arq:abort`` set) in one MULTI, which
a Redis Cluster refuses across slots. llmq keeps a request's job, try counter and
in-progress marker in its model's slot (:mod:`llmq.protocol.keys`), deleted by
:meth:`Queue.finish` in one command of that slot; nothing of llmq is ever in
``arq:abort``, and results are not kept (``keep_result=0``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from arq.worker import Worker, func

from llmq.outage import OUTAGE, Outage
from llmq.protocol import keys
from llmq.protocol.arq_job import JOB_FUNCTION, deserialize, serialize
from llmq.protocol.queue import Claim, Queue
from llmq.schema import JobPayload
from worker.claimed import ClaimedJob, ClaimingRedis, carry
from worker.runner import RequestRunner

log = logging.getLogger(__name__)

#: How long a new claim waits for this process's own older attempt of it to end.
OLDER_ATTEMPT_SECONDS = 5.0


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
    await runner.run(job, attempt=int(ctx.get("job_try", 1)))


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
            functions=[func(generate, name=JOB_FUNCTION, max_tries=max_tries)],
            queue_name=keys.queue(model),
            redis_pool=redis,
            handle_signals=False,
            max_jobs=max_jobs,
            poll_delay=poll_seconds,
            job_timeout=job_timeout,
            keep_result=0,
            max_tries=max_tries,
            ctx={"runner": runner},
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
        self._reads: dict[str, ClaimedJob] = {}  # claimed, not yet read by run_job

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
                await self._poll_iteration()
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

    async def _poll_iteration(self) -> None:
        while self.allow_pick_jobs and self.job_counter < self.max_jobs:
            claim = await self.queue.claim(
                self.model,
                lease_ms=self.lease_ms,
                in_progress_ms=int(self.in_progress_timeout_s * 1000),
                budget_left=self.token_budget - self.tokens_in_use if self.token_budget else None,
                idle=not self._claims,
                worker_id=self.worker_id,
                free_slots=self.max_jobs - self.job_counter,
                capacity=self.max_jobs,
                end_dropped=True,
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

    async def _take(self, claim: Claim) -> None:
        assert claim.request_id is not None
        if not await self._older_attempt_ended(claim):
            return
        await self.sem.acquire()  # never waits: job_counter < max_jobs
        self._reads[claim.request_id] = ClaimedJob(claim.request_id, claim.job, claim.job_try)
        self._start(claim.request_id, claim.score, claim.cost, claim.job_try)

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
        await self.queue.requeue(self.model, rid, claim.job_try)
        log.warning(
            "request %s handed back: an older attempt still runs here",
            rid,
            extra={"request_id": rid},
        )
        return False

    async def take_handoff(self, claim: Claim) -> None:
        """Run a request claimed for this worker by the enqueue script.

        A worker that cannot take it (stopping, or its slots filled meanwhile by a
        claim that crossed the hand-off) puts it back in the queue at once.
        """
        if claim.request_id is None:
            return
        if self.allow_pick_jobs and self.job_counter < self.max_jobs:
            await self._take(claim)
            return
        await self.queue.requeue(self.model, claim.request_id, claim.job_try)
        log.info(
            "request %s handed back: no free slot",
            claim.request_id,
            extra={"request_id": claim.request_id},
        )

    def _start(self, job_id: str, score: int, cost: int, attempt: int) -> None:
        self._claims[job_id] = (cost, attempt)
        self.job_counter += 1
        task = self.loop.create_task(self.run_job(job_id, score))
        task.add_done_callback(self._slot_freed)
        self.tasks[job_id] = task

    async def run_job(self, job_id: str, score: int) -> None:
        """arq's run_job, reading the job from the claim rather than from Redis."""
        claimed = self._reads.pop(job_id, None)
        if claimed is not None:
            carry(claimed)  # this task's context: only this run_job's read sees it
        await super().run_job(job_id, score)

    def _slot_freed(self, _: asyncio.Task[None]) -> None:
        self._release_sem_dec_counter_on_complete()
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
        if job_id in self.runner.fenced:
            # Lost to another attempt: arq's bookkeeping (delete the job, drop it from
            # the queue) would now hit the request that attempt runs or has requeued.
            self.runner.fenced.discard(job_id)
            self._claims.pop(job_id, None)
            return
        if finish:
            await self.runner.end_unfinished(job_id)
            await self._finish(job_id)
        else:
            self.runner.unfinished.pop(job_id, None)  # handed back: a later run ends it
            await self._hand_back(job_id)

    async def finish_failed_job(self, job_id: str, result_data: bytes | None) -> None:
        await self._finish(job_id)
        await self.runner.fail(job_id, "job_failed", "the request could not be run")

    async def _finish(self, job_id: str) -> None:
        claim = self._claims.pop(job_id, None)
        await self.queue.finish(self.model, job_id, None if claim is None else claim[1])

    async def _hand_back(self, job_id: str) -> None:
        claim = self._claims.pop(job_id, None)
        if claim is not None and await self.queue.requeue(self.model, job_id, claim[1]):
            log.info("request %s handed back to the queue", job_id, extra={"request_id": job_id})
