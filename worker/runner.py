"""Running one request: the model's tokens become events on the request's stream.

The runner publishes ``started``, then ``tokens`` (coalesced by the publisher),
then exactly one terminal event, updating the request's record alongside the
events that change its status:

- ``done`` with ``stop``/``length`` when the model finished;
- ``done`` with ``cancelled`` when the client cancelled (the generation task is
  cancelled at once, so the slot frees within about one token interval);
- ``error`` with ``finish_reason: timeout`` when the generation timeout fired, or
  the job timeout (``job_timeout``, arq's hard limit on the run) was about to: the
  generation stops ``JOB_TIMEOUT_MARGIN`` before it, so that this terminal write
  fits inside the limit. Should arq's timeout fire all the same (a slow write on a
  loaded machine), the run is left *unfinished* and :meth:`RequestRunner.end_unfinished`
  ends it as the attempt that ran it, once arq is done with it;
- ``error`` with ``model_error`` when the model raised (after ``max_tries`` runs), or
  with the model's own code and message when it refused the request
  (:class:`~llmq.model.interface.Refused`: not retried).

When the worker itself is stopping, the cancellation is not a client's: it
propagates, and arq hands the request back to the queue.

A run that lost its request (its lease was reaped, or a later attempt's write
raised the fence) is *fenced*: the publisher's script refuses its writes and says
so, or the lease renewal reports it ``lost``; the runner then stops the generation
at once and writes nothing more: no terminal event, no record, no lifecycle note,
no outcome metric (outcomes are counted only once their terminal write landed).
A run that cannot hear from Redis does not wait for that answer to stop its model:
when its lease would have expired by this process's clock, the generation pauses
(:meth:`RequestRunner.expire_leases`), and the next renewal's answer resumes it
(the lease held: Redis was only stalled) or fences the run.

A re-run (``attempt`` > 1: the previous worker died or stopped, or the model
raised) resumes instead of starting over: once its ``started`` event is written,
the runner reads the tokens the stream already holds (contiguous from index 0),
passes them to the model as ``GenerationRequest.generated`` and publishes the new
tokens from the next index. Tokens a dead worker never wrote are generated again;
tokens written twice (a stopping worker's last flush racing the re-run) carry the
same indices, which readers drop. A first run pays no extra round trip.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import struct
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from arq.worker import Retry
from opentelemetry.trace import Span
from redis.asyncio import Redis

from llmq import metrics, tracing
from llmq.metrics import Tally
from llmq.model.interface import (
    Backend,
    CacheReporting,
    Embedder,
    GenerationRequest,
    Output,
    Refused,
    Report,
    SteppedBackend,
    Token,
    ToolCallStart,
    capabilities_of,
    seed_for,
)
from llmq.protocol.streams import final_event_id, published_tokens
from llmq.schema import (
    DoneEvent,
    EmbeddingEvent,
    ErrorEvent,
    FinishReason,
    JobPayload,
    Lifecycle,
    LifecycleKind,
    PromptTokensDetails,
    StartedEvent,
    Timings,
    ToolCallEvent,
    Usage,
)
from worker.leases import LeaseClock
from worker.pace import PaceMeter
from worker.publisher import Fenced, StreamPublisher
from worker.run import Progress, Run, RunStatus

log = logging.getLogger(__name__)

#: Vectors per stream event of an embedding request: bounds an entry's size.
EMBEDDINGS_PER_EVENT = 64

#: How long a cancel received for an unknown request is remembered (it may be
#: about to start on this worker).
CANCEL_MEMORY_SECONDS = 60.0

#: How long a run that failed waits for its queued tokens to land before it is
#: handed back (beyond it, e.g. while Redis is away, its re-run generates them again).
SETTLE_SECONDS = 1.0

#: The generation stops this long (at most a fifth of the job timeout) before the
#: job timeout, leaving the terminal write time to land before arq cancels the run.
JOB_TIMEOUT_MARGIN = 1.0


def job_time_limit(job_timeout: float) -> float:
    """Seconds a run may generate under arq's ``job_timeout``."""
    return job_timeout - min(JOB_TIMEOUT_MARGIN, job_timeout / 5)


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


#: Turns of the event loop a model's first step may take before it waits on its
#: engine: an upstream request's body is written by aiohttp in a task of its own,
#: which on Python 3.11 runs a turn after the request is made (3.12 starts it
#: eagerly). What a run does around its start waits for them (:func:`_underway`).
UNDERWAY_TURNS = 2


async def _underway() -> None:
    """Give a model started in this turn the loop's next turns, so that its first step
    (an upstream's request written, a prefill begun) goes before the run's own
    bookkeeping: the ``started`` note, metrics and write, none of them on the first
    token's path."""
    for _ in range(UNDERWAY_TURNS):
        await asyncio.sleep(0)


@dataclass
class RequestRunner:
    """Runs requests for one worker process on ``backend``; ``runs`` maps id -> its
    run (:class:`worker.run.Run`: its progress and status) while it runs.

    ``metrics`` receives the worker-side figures (queue, prefill, decode, ITL, TPOT,
    tokens, outcomes); ``model`` (the served model's name) labels those of jobs too
    malformed to name one.
    ``redis`` reads a re-run's stream back; by default, the publisher's client.
    ``job_timeout`` is arq's limit on one run (None: none); see :func:`job_time_limit`.
    ``leases`` times each run's lease by this process's clock (None: only Redis's
    answers end a run that lost its lease); see :mod:`worker.leases`.
    """

    worker_id: str
    backend: Backend
    publisher: StreamPublisher
    metrics: Tally = field(default_factory=Tally)
    model: str = ""
    max_tries: int = 3
    redis: Redis | None = None
    job_timeout: float | None = None
    leases: LeaseClock | None = None
    #: The runs in progress, by request id.
    runs: dict[str, Run] = field(default_factory=dict)
    #: Runs that ended fenced or unfinished, until arq finishes their job
    #: (:meth:`lost`, :meth:`end_unfinished`, :meth:`forget`).
    ended: dict[str, Run] = field(default_factory=dict)
    #: Prompt + completion tokens of each run that wrote its outcome, until arq
    #: finishes its job (:meth:`take_used`): the queue's release settles fair share
    #: to it without reading the record back.
    used: dict[str, int] = field(default_factory=dict)
    #: What embeds an embedding request's inputs (None: the worker serves none).
    embedder: Embedder | None = None
    #: Cancels received for requests not running here (yet), by when.
    _cancels_ahead: dict[str, float] = field(default_factory=dict)
    #: Prompt tokens this worker's backend looked up in its prefix cache, and found.
    cache_queries: int = 0
    cache_hits: int = 0
    #: How fast the backend serves, from the runs that ended here (routing's load guard).
    pace: PaceMeter = field(default_factory=PaceMeter)
    #: Told (request id, attempt) when a run's model is done with it for good, before
    #: the run writes its outcome: the model's slot is free from then on.
    on_model_done: Callable[[str, int], None] | None = None
    #: What every run's spans say of how this worker claims (its routing policy and
    #: fairness, as the live policy has them at the run's start), while tracing is on.
    trace_attributes: Callable[[], Mapping[str, str]] = dict

    def __post_init__(self) -> None:
        # What the backend offers, asked once: an isinstance check against a runtime
        # protocol inspects the class's attributes every time, on every run's path to
        # its model.
        self._stepped = self.backend if isinstance(self.backend, SteppedBackend) else None
        self._reports_cache = isinstance(self.backend, CacheReporting)

    def cancel(self, request_id: str) -> bool:
        """Stop a running request (True), or remember the cancel in case it starts here."""
        run = self.runs.get(request_id)
        if run is not None:
            return run.cancel()
        now = time.monotonic()
        self._cancels_ahead[request_id] = now
        for rid, at in list(self._cancels_ahead.items()):
            if now - at > CANCEL_MEMORY_SECONDS:
                del self._cancels_ahead[rid]
        return False

    def hand_back(self, request_id: str) -> None:
        """Stop a running request and return it to the queue: this worker's model cannot
        run it now (its inference server stopped answering), or a batch line gives its
        slot to a live request. The next attempt resumes after the tokens published so
        far."""
        run = self.runs.get(request_id)
        if run is not None:
            run.hand_back()
            tracing.event(run.span, "llmq.handed_back", tokens=run.progress.produced)

    @property
    def batch_lines(self) -> set[str]:
        """The running batch lines (``JobPayload.batch``): what gives a slot to a live
        request."""
        return {rid for rid, run in self.runs.items() if run.payload.batch is not None}

    def all_of(self, request_ids: list[str], tenant: str) -> bool:
        """Whether every one of ``request_ids`` that runs here is ``tenant``'s."""
        runs = self.runs
        return all(runs[r].payload.tenant == tenant for r in request_ids if r in runs)

    def fence(self, request_id: str, why: str = "this worker lost its lease") -> None:
        """This worker lost a running request: stop it, and write nothing more for it."""
        run = self.runs.get(request_id)
        if run is None or run.fenced:
            return
        log.warning(
            "request %s: %s; stopping it without writing (at %d tokens)",
            request_id,
            why,
            run.progress.produced,
            extra={"request_id": request_id},
        )
        run.fence()

    def lost(self, request_id: str) -> bool:
        """Whether the run that ended was fenced (then forgotten): arq's bookkeeping of
        its job must not touch the request another attempt runs or has requeued."""
        run = self.ended.get(request_id)
        if run is None or not run.fenced:
            return False
        del self.ended[request_id]
        self.used.pop(request_id, None)
        return True

    def forget(self, request_id: str) -> None:
        """The run that ended is handed back: a later attempt ends the request."""
        self.ended.pop(request_id, None)
        self.used.pop(request_id, None)

    def take_used(self, request_id: str) -> int | None:
        """The tokens the request's run used (its record's prompt + completion), as it
        wrote them; None if no run here wrote its outcome."""
        return self.used.pop(request_id, None)

    def produced(self) -> dict[str, int]:
        """Tokens produced so far (resumed ones included) by each running request."""
        return {rid: run.progress.produced for rid, run in self.runs.items()}

    def expire_leases(self) -> None:
        """Pause the generations whose lease would have expired by this process's
        clock: no renewal has answered for them for a lease (see :mod:`worker.leases`).

        The model stops at once (its task is cancelled); the run then waits for Redis.
        A renewal that answers ``ok`` (Redis was only stalled: its lease clock did not
        run meanwhile) resumes the generation from the tokens produced so far, as a
        re-run would (:meth:`resume`); ``lost`` fences the run, ``cancelled`` ends it.
        Only while the model generates: that is the work to save. A run whose
        generation ended is writing its terminal event, which the publisher's fence
        lands or refuses by the lease Redis holds.
        """
        if self.leases is None:
            return
        now = asyncio.get_running_loop().time()
        for rid, run in list(self.runs.items()):
            if run.lease is None or not self.leases.due(run.lease, now):
                continue
            if run.pause_for_lease():
                tracing.event(run.span, "llmq.paused", tokens=run.progress.produced)
                log.warning(
                    "request %s: its lease would have expired by this worker's clock; "
                    "generation paused at %d tokens until Redis answers",
                    rid,
                    run.progress.produced,
                    extra={"request_id": rid},
                )

    def renewed(self, request_id: str, sent_at: float, tokens: int) -> None:
        """A renewal sent at ``sent_at`` (loop time), when the run had produced
        ``tokens``, answered ``ok``: its lease is timed from then."""
        run = self.runs.get(request_id)
        if self.leases is not None and run is not None and run.lease is not None:
            self.leases.renewed(run.lease, sent_at, tokens)

    def resume(self, request_id: str) -> None:
        """A renewal answered ``ok``: a generation paused by the lease clock goes on,
        unless that renewal was sent so long ago that the lease is due again (one sent
        before a stall, answered after it): the next renewal decides."""
        run = self.runs.get(request_id)
        if run is None:
            return
        if self.leases is not None and run.lease is not None:
            if self.leases.expires_at(run.lease) <= asyncio.get_running_loop().time():
                return
        run.resume()

    async def _through_pauses(
        self, run: Run, generation: asyncio.Task[FinishReason]
    ) -> FinishReason:
        """The generation's outcome; a pause by the lease clock (:meth:`expire_leases`)
        waits for Redis's verdict, then resumes with a new generation task, or ends
        with the cancellation (the run was fenced or cancelled meanwhile)."""
        while True:
            try:
                return await generation
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if run.pause is None or (current is not None and current.cancelling()):
                    raise
                if not await run.wait_pause():
                    raise
            tracing.event(run.span, "llmq.resumed", tokens=run.progress.produced)
            log.info(
                "request %s: Redis answered and the lease holds; generation resumes at %d",
                run.request_id,
                run.progress.produced,
                extra={"request_id": run.request_id},
            )
            generation = asyncio.create_task(self._generate(run, run.progress.texts))
            run.generation = generation

    async def run(self, payload: JobPayload, attempt: int) -> None:
        rid = payload.request_id
        loop = asyncio.get_running_loop()
        run = self.runs[rid] = Run(payload, attempt, started=time.time())
        self.publisher.own(rid, attempt, self.fence)
        if self._cancels_ahead.pop(rid, None) is not None:
            run.cancel()
        if self.leases is not None:
            run.lease = self.leases.start(loop.time())
        if self.job_timeout is not None:
            run.progress.deadline = loop.time() + job_time_limit(self.job_timeout)
        run.span = self._spans(payload, attempt, run.started)
        try:
            with tracing.use(run.span):
                await self._run(run)
        except Fenced:
            self.fence(rid)
        except BaseException as exc:
            run.stop_unfinished(interrupted=isinstance(exc, asyncio.CancelledError))
            raise
        finally:
            self.publisher.disown(rid)
            del self.runs[rid]
            if run.fenced:
                self._count_lost(run)
            if run.status in (RunStatus.FENCED, RunStatus.UNFINISHED):
                self.ended[rid] = run

    def _spans(self, payload: JobPayload, attempt: int, started: float) -> Span | None:
        """The attempt's ``llmq.queue_wait`` (ended) and ``llmq.run`` spans, in the
        request's trace (:func:`llmq.tracing.start_job`); None while tracing is off."""
        if not tracing.enabled():
            return None
        attributes: dict[str, str | int] = {
            "llmq.request.id": payload.request_id,
            "gen_ai.request.model": payload.model,
            "llmq.priority": payload.priority,
            "llmq.attempt": attempt,
            "llmq.worker.id": self.worker_id,
            **self.trace_attributes(),
        }
        if payload.tenant is not None:
            attributes["llmq.tenant"] = payload.tenant
        if payload.batch is not None:
            attributes["llmq.batch.id"] = payload.batch
        return tracing.start_job(
            payload.trace,
            enqueued_at=payload.enqueued_at,
            claimed_at=started,
            attributes=attributes,
            run_attributes={
                "gen_ai.request.max_tokens": payload.params.max_tokens,
                "gen_ai.usage.input_tokens": payload.prompt_tokens,
            },
        )

    def _count_lost(self, run: Run) -> None:
        """The tokens a fenced run produced after its last successful renewal: work
        nobody reads (the re-run generates them again unless they landed)."""
        progress, rid = run.progress, run.request_id
        renewed = run.lease.tokens if run.lease is not None else None
        lost = progress.produced - max(renewed or 0, progress.resumed)
        log.info(
            "request %s: fenced run stopped at %d tokens, %d since its last lease renewal",
            rid,
            progress.produced,
            lost,
            extra={"request_id": rid},
        )
        self.metrics.inc(metrics.LEASE_LOST_TOKENS, run.payload.model, amount=max(lost, 0))

    async def end_unfinished(self, request_id: str) -> None:
        """End a run that arq finished without its terminal event (its job timeout
        fired, or the runner raised), as the attempt that ran it: a fenced attempt
        writes nothing. A run that is handed back instead is only forgotten
        (:meth:`forget`)."""
        ended = self.ended.get(request_id)
        if ended is None or ended.status is not RunStatus.UNFINISHED:
            return
        del self.ended[request_id]
        finish: FinishReason = "timeout"
        limit = f" of {self.job_timeout:g} s" if self.job_timeout is not None else ""
        code, message = "generation_timeout", f"the run stopped at the job timeout{limit}"
        if not ended.interrupted:  # the runner raised: a bug, not the model
            finish, code, message = "error", "worker_error", "the worker failed to run the request"
        self.publisher.own(request_id, ended.attempt, self.fence)
        # Ended as a run of its own: only what the stream holds, no report of the model's.
        run = Run(ended.payload, ended.attempt, progress=Progress(produced=ended.progress.produced))
        try:
            await self._finish_error(run, code, message, finish)
        except Fenced:
            pass
        finally:
            self.publisher.disown(request_id)

    async def _run(self, run: Run) -> None:
        payload, attempt, started = run.payload, run.attempt, run.started
        declared = self.capabilities()
        missing = [p for c, p in payload.required_capabilities() if c not in declared]
        if missing:
            # Accepted while no worker could say (LLMQ_ACCEPT_MODELS): refuse, never ignore.
            message = f"the model does not support {', '.join(missing)}"
            await self.fail(payload.request_id, "unsupported_parameter", message)
            return
        queue_ms = _ms(max(0.0, started - payload.enqueued_at))
        if payload.embed is not None:
            await self._embed(run, queue_ms)
            return
        if attempt == 1:
            await self._generate_and_finish(run, queue_ms, [], None)
            return
        if await self._ended_before(payload.request_id):
            return
        # A re-run resumes: its "started" is written, then the stream read, before the model.
        announced = self._announce(payload, attempt, queue_ms, started)
        try:
            generated = await self._published(payload.request_id, announced)
        except BaseException:
            await asyncio.shield(announced)
            raise
        await self._generate_and_finish(run, queue_ms, generated, announced)

    def capabilities(self) -> tuple[str, ...]:
        """What this worker honours: its model's declaration, with ``embeddings`` only
        where it has an embedder."""
        declared = set(capabilities_of(self.backend)) - {"embeddings"}
        if self.embedder is not None:
            declared.add("embeddings")
        return tuple(sorted(declared))

    async def _embed(self, run: Run, queue_ms: float) -> None:
        """An embedding request: its vectors, then ``done`` (a re-run writes them again:
        readers keep the first copy of each index)."""
        payload, attempt, started = run.payload, run.attempt, run.started
        task, embedder, rid = payload.embed, self.embedder, payload.request_id
        if task is None or embedder is None:
            return
        written = [self._announce(payload, attempt, queue_ms, started)]
        self.metrics.observe(metrics.QUEUE_TIME, queue_ms / 1000, payload.model)
        self._note(payload, "started", attempt=attempt, queue_ms=queue_ms)
        try:
            async with asyncio.timeout(payload.generation_timeout):
                vectors = await embedder.embed(task.inputs, task.dimensions, task.seed)
        except TimeoutError:
            await asyncio.gather(*written)
            message = f"embedding stopped after its timeout of {payload.generation_timeout:g} s"
            await self._finish_error(run, "generation_timeout", message, "timeout")
            return
        except Exception as exc:
            log.exception("embedding failed on request %s", rid, extra={"request_id": rid})
            await asyncio.gather(*written)
            await self._finish_error(run, "model_error", f"model failed: {exc}", "error")
            return
        for start in range(0, len(vectors), EMBEDDINGS_PER_EVENT):
            chunk = vectors[start : start + EMBEDDINGS_PER_EVENT]
            event = EmbeddingEvent(index=start, vectors=[vector_base64(v) for v in chunk])
            written.append(self.publisher.post(rid, event))
        await asyncio.gather(*written)  # a fenced run raises here, before its terminal event
        await self._finish_done(run, "stop", queue_ms)

    def _announce(
        self,
        payload: JobPayload,
        attempt: int,
        queue_ms: float,
        started: float,
        *,
        flush: bool = True,
    ) -> asyncio.Future[None]:
        """Queue the ``started`` event and record update; the future says when written
        (``flush`` False: with the next flush, see :meth:`StreamPublisher.post`)."""
        return self.publisher.post(
            payload.request_id,
            StartedEvent(worker=self.worker_id, attempt=attempt, queue_ms=queue_ms),
            record={
                "status": "running",
                "started_at": str(started),
                "worker": self.worker_id,
                "attempts": str(attempt),
            },
            flush=flush,
        )

    async def _ended_before(self, rid: str) -> bool:
        """Whether an earlier attempt wrote the request's end, then stopped or was cut
        off before its finish and was reaped: this re-run writes nothing (no second
        ``started`` over the record, no second end or count); its finish releases the
        request. Read before anything is written; if it cannot be read, the re-run goes
        on as any other."""
        try:
            redis = self.redis if self.redis is not None else self.publisher.redis
            ended = await final_event_id(redis, rid) is not None
        except Exception:
            return False
        if ended:
            log.info(
                "request %s ended in an earlier attempt; nothing to run",
                rid,
                extra={"request_id": rid},
            )
        return ended

    async def _published(self, rid: str, announced: asyncio.Future[None]) -> list[str]:
        """The tokens earlier runs published; none if they cannot be read (start over).

        Read once ``announced`` (this run's "started") is written: the publisher writes
        a stream's events in order, so tokens an earlier run in this process had still
        queued (a model error, retried here) are in the stream by then. Only a dead or
        stopping process's unwritten tokens are missed: they are generated again.
        """
        try:
            await asyncio.shield(announced)  # a worker stopping cancels us, not the write
            redis = self.redis if self.redis is not None else self.publisher.redis
            generated = await published_tokens(redis, rid)
        except Fenced:
            raise
        except Exception as exc:
            log.warning(
                "request %s: could not read its published tokens (%s); generating from 0",
                rid,
                exc,
                extra={"request_id": rid},
            )
            return []
        if generated:
            log.info(
                "request %s resumes after %d published tokens",
                rid,
                len(generated),
                extra={"request_id": rid},
            )
        return generated

    async def _generate_and_finish(
        self,
        run: Run,
        queue_ms: float,
        generated: list[str],
        announced: asyncio.Future[None] | None,
    ) -> None:
        """Run the model and publish the outcome; a first run (``announced`` None)
        announces itself, written once the model is underway, so that prefill waits
        for nothing."""
        progress = run.progress
        progress.produced = progress.resumed = len(generated)
        progress.texts = list(generated)
        generation = asyncio.create_task(self._generate(run, generated))
        run.generation = generation
        if run.status is not RunStatus.RUNNING:  # cancelled (or fenced) before it began
            generation.cancel()
        if announced is None:
            # Queued before the model has run a step, so "started" precedes every token;
            # its flush waits until the model is underway (_outcome).
            announced = self._announce(run.payload, run.attempt, queue_ms, run.started, flush=False)
        try:
            await self._outcome(run, queue_ms, generation)
        finally:
            self.publisher.flush_soon()  # "started", if the run ends before the model ran
            await asyncio.shield(announced)

    async def _outcome(
        self, run: Run, queue_ms: float, generation: asyncio.Task[FinishReason]
    ) -> None:
        payload, attempt, rid = run.payload, run.attempt, run.request_id
        try:
            await _underway()
            self.publisher.flush_soon()  # "started", queued before the model's first step
            self.metrics.observe(metrics.QUEUE_TIME, queue_ms / 1000, payload.model)
            self._note(payload, "started", attempt=attempt, queue_ms=queue_ms)
            finish = await self._through_pauses(run, generation)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                generation.cancel()
                raise  # the worker is stopping: let arq hand the request back
            if run.status is RunStatus.FENCED:
                return
            if run.status is RunStatus.HANDING_BACK:
                await self._settle(rid)
                raise Retry() from None  # arq hands it back to the queue
            finish = "cancelled"
        except Refused as exc:
            # The request's own fault (an upstream's 4xx): it would fail alike anywhere.
            await self._finish_error(run, exc.code, exc.message, "error", refused=exc)
            return
        except Exception as exc:
            log.exception(
                "model failed on request %s (attempt %d of %d)",
                rid,
                attempt,
                self.max_tries,
                extra={"request_id": rid},
            )
            if attempt < self.max_tries:
                # arq hands it back to the queue; the re-run resumes after the tokens
                # published so far. A poison request ends after max_tries.
                await self._settle(rid)
                raise Retry() from exc
            await self._finish_error(run, "model_error", f"model failed: {exc}", "error")
            return
        finally:
            run.generation = None
            if self.on_model_done is not None:
                self.on_model_done(rid, attempt)
        if run.status is RunStatus.FENCED:
            return
        if finish == "timeout":
            message = f"generation stopped after its timeout of {payload.generation_timeout:g} s"
            if run.progress.by_job_timeout:
                message = f"generation stopped before the job timeout of {self.job_timeout:g} s"
            await self._finish_error(run, "generation_timeout", message, "timeout")
            return
        await self._finish_done(run, finish, queue_ms)

    async def _settle(self, rid: str) -> None:
        """Wait (briefly) until this run's queued tokens are written: handing the request
        back raises its fence past this attempt, which would drop them, and the re-run
        would generate them again."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.publisher.written(rid), SETTLE_SECONDS)

    async def _generate(self, run: Run, generated: list[str]) -> FinishReason:
        payload, progress = run.payload, run.progress
        rid = payload.request_id
        params = payload.params
        request = GenerationRequest(
            prompt=payload.prompt,
            max_tokens=params.max_tokens,
            seed=seed_for(rid, params.seed),
            prompt_tokens=payload.prompt_tokens,
            stop=params.stop,
            temperature=params.temperature,
            generated=tuple(generated),
            ignore_eos=params.ignore_eos,
            min_tokens=params.min_tokens,
            logprobs=params.logprobs,
            response_format=params.response_format,
            tools=params.tools,
            tool_choice=params.tool_choice,
            after_tool_result=params.after_tool_result,
            messages=payload.messages or (),
        )
        observe, itl, model = self.metrics.observe, metrics.ITL, payload.model
        token, texts = self.publisher.token, progress.texts
        loop = asyncio.get_running_loop()

        def take(out: Output) -> None:
            """One output of the model: queued for the flush, no await."""
            if type(out) is str:  # a plain token: nearly every output
                token(rid, progress.produced, out)
            elif not isinstance(out, str):  # a tool call's start, a report
                self._aside(rid, progress, out)
                return
            elif isinstance(out, Token):
                token(rid, progress.produced, str(out), out.logprob)
            else:
                token(rid, progress.produced, out)
            texts.append(str(out))
            now = time.time()
            progress.produced += 1
            if progress.first_at is None:
                # No ITL across the gap between runs; and a resumed request's
                # first token reached its readers in an earlier run.
                progress.first_at = now
                # Noted once the token's flush is under way: not on its path.
                loop.call_soon(self._first_token, run, now)
            else:
                observe(itl, now - progress.last_at, model)
            progress.last_at = now

        # The generation timeout, or the job timeout's deadline if that comes first;
        # a generation resumed after a pause keeps the first one's.
        if progress.generation_deadline is None:
            progress.generation_deadline = loop.time() + payload.generation_timeout
        deadline = progress.generation_deadline
        if progress.deadline is not None and progress.deadline < deadline:
            deadline, progress.by_job_timeout = progress.deadline, True
        try:
            async with asyncio.timeout_at(deadline):
                if self._stepped is not None:
                    # Tokens arrive by callback from the model's step loop: no wake-up
                    # of this task per token.
                    await self._stepped.generate_into(request, take)
                else:
                    async for out in self.backend.generate(request):
                        take(out)
        except TimeoutError:
            return "timeout"
        if progress.finish_reason is not None:
            return progress.finish_reason
        return "length" if progress.produced >= params.max_tokens else "stop"

    def _aside(self, rid: str, progress: Progress, out: ToolCallStart | Report) -> None:
        """An output that is not a token: a tool call's start, or the backend's report."""
        match out:
            case ToolCallStart(id=call_id, name=name):
                # Before its argument tokens, in stream order; not a token itself.
                event = ToolCallEvent(index=progress.produced, id=call_id, name=name)
                # Not awaited: a failed write surfaces with the tokens' flush.
                written = self.publisher.post(rid, event)
                written.add_done_callback(lambda f: f.cancelled() or f.exception())
            case Report(prompt_tokens=prompt, cached_tokens=cached, finish_reason=reason):
                if prompt is not None:
                    progress.prompt_tokens = prompt
                if cached is not None:
                    progress.cached_tokens = cached
                if reason is not None:
                    progress.finish_reason = reason

    async def _finish_done(self, run: Run, finish: FinishReason, queue_ms: float) -> None:
        payload, progress, started = run.payload, run.progress, run.started
        now = time.time()
        first = progress.first_at if progress.first_at is not None else now
        usage = _usage(payload, progress)
        event = DoneEvent(
            finish_reason=finish,
            usage=usage,
            timings=Timings(
                queue_ms=queue_ms, prefill_ms=_ms(first - started), decode_ms=_ms(now - first)
            ),
        )
        self._note(
            payload,
            "cancelled" if finish == "cancelled" else "finished",
            e2e_ms=_ms(now - payload.enqueued_at),
            finish_reason=finish,
            completion_tokens=progress.produced,
        )
        run.finish()
        self._traced(run, finish, usage)
        await self.publisher.emit(
            payload.request_id,
            event,
            record={
                "status": "cancelled" if finish == "cancelled" else "done",
                "finished_at": str(now),
                "finish_reason": finish,
                "completion_tokens": str(progress.produced),
                **_cache_fields(usage),
            },
        )
        self.used[payload.request_id] = payload.prompt_tokens + progress.produced
        self._count(payload, progress.produced, finish, usage)
        m, model = self.metrics, payload.model
        if progress.first_at is not None:
            if not progress.resumed and finish != "cancelled":
                uncached = usage.prompt_tokens - _cached_tokens(usage)
                self.pace.ran(uncached, first - started, now - started)
            m.observe(metrics.PREFILL_TIME, first - started, model)
            m.observe(metrics.DECODE_TIME, now - first, model)
        decoded = progress.produced - progress.resumed  # by this run: its decode time
        if decoded > 1:
            m.observe(metrics.TPOT, (now - first) / (decoded - 1), model)

    async def _finish_error(
        self,
        run: Run,
        code: str,
        message: str,
        finish: FinishReason,
        refused: Refused | None = None,
    ) -> None:
        payload, progress = run.payload, run.progress
        produced = progress.produced
        usage = _usage(payload, progress)
        run.finish()
        self._traced(run, finish, usage, code)
        self._note(
            payload,
            "failed",
            e2e_ms=_ms(time.time() - payload.enqueued_at),
            finish_reason=finish,
            completion_tokens=produced,
        )
        await self.publisher.emit(
            payload.request_id,
            ErrorEvent(
                code=code,
                message=message,
                finish_reason=finish,
                usage=usage,
                refused=refused is not None,
                param=refused.param if refused is not None else None,
            ),
            record={
                "status": "failed",
                "finished_at": str(time.time()),
                "finish_reason": finish,
                "completion_tokens": str(produced),
                "error": message,
                **_cache_fields(usage),
            },
        )
        self.used[payload.request_id] = payload.prompt_tokens + produced
        self._count(payload, produced, finish, usage)

    def _first_token(self, run: Run, at: float) -> None:
        """This run's first token: the request's TTFT unless it resumed (its first
        token reached its readers in an earlier run), and an event of its span."""
        payload = run.payload
        if not run.progress.resumed:
            self._note(payload, "first_token", ttft_ms=_ms(at - payload.enqueued_at))
        tracing.event(run.span, "llmq.first_token", at, index=run.progress.resumed)

    def _traced(
        self, run: Run, finish: FinishReason, usage: Usage, error: str | None = None
    ) -> None:
        """The run's outcome on its span (while tracing is on)."""
        if run.span is None:
            return
        details = usage.prompt_tokens_details
        tracing.outcome(
            run.span,
            finish,
            input_tokens=usage.prompt_tokens,
            output_tokens=usage.completion_tokens,
            cached_tokens=None if details is None else details.cached_tokens,
            resumed_tokens=run.progress.resumed,
            error=error,
        )

    def _note(self, payload: JobPayload, event: LifecycleKind, **fields: Any) -> None:
        if event != "first_token":
            log.info(
                "request %s %s %s",
                payload.request_id,
                event,
                " ".join(f"{k}={v}" for k, v in fields.items()),
                extra={"request_id": payload.request_id, "event": event},
            )
        self.publisher.note(
            Lifecycle(
                event=event,
                request_id=payload.request_id,
                model=payload.model,
                ts=time.time(),
                worker=self.worker_id,
                priority=payload.priority,
                tenant=payload.tenant,
                **fields,
            )
        )

    async def fail(self, request_id: str, code: str, message: str) -> None:
        """Publish a terminal error for a request the runner could not start (unfenced:
        no run of it can write anything else)."""
        await self.publisher.emit(
            request_id,
            ErrorEvent(code=code, message=message),
            record={
                "status": "failed",
                "finished_at": str(time.time()),
                "finish_reason": "error",
                "error": message,
            },
        )
        self.metrics.inc(metrics.REQUESTS, self.model, "error")

    def _count(
        self, payload: JobPayload, produced: int, finish: FinishReason, usage: Usage
    ) -> None:
        """The outcome and token figures of a request that ended here; the prefix cache's
        (prompt tokens looked up and found, as vLLM counts them) for a backend that has
        one: it reports its hits, so no report is a miss."""
        m, model = self.metrics, payload.model
        details = usage.prompt_tokens_details
        if details is not None or self._reports_cache:
            cached = _cached_tokens(usage)
            m.inc(metrics.PREFIX_CACHE_QUERIES, model, amount=usage.prompt_tokens)
            m.inc(metrics.PREFIX_CACHE_HITS, model, amount=cached)
            self.cache_queries += usage.prompt_tokens
            self.cache_hits += cached
        m.inc(metrics.REQUESTS, model, finish)
        m.inc(metrics.PROMPT_TOKENS, model, amount=payload.prompt_tokens)
        m.inc(metrics.GENERATION_TOKENS, model, amount=produced)
        m.observe(metrics.PROMPT_TOKENS_HIST, payload.prompt_tokens, model)
        m.observe(metrics.GENERATION_TOKENS_HIST, produced, model)


def vector_base64(vector: list[float]) -> str:
    """A vector as the base64 of its little-endian float32 components."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


def _usage(payload: JobPayload, progress: Progress) -> Usage:
    """Counted from what the run produced; the prompt as the backend counted it, if it said."""
    prompt = payload.prompt_tokens if progress.prompt_tokens is None else progress.prompt_tokens
    details = None
    if progress.cached_tokens is not None:
        details = PromptTokensDetails(cached_tokens=min(progress.cached_tokens, prompt))
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=progress.produced,
        total_tokens=prompt + progress.produced,
        prompt_tokens_details=details,
    )


def _cached_tokens(usage: Usage) -> int:
    """Prompt tokens the backend found cached (0 when it did not say)."""
    details = usage.prompt_tokens_details
    return details.cached_tokens if details is not None else 0


def _cache_fields(usage: Usage) -> dict[str, str]:
    """The record's ``cached_tokens``, when the backend said."""
    details = usage.prompt_tokens_details
    return {} if details is None else {"cached_tokens": str(details.cached_tokens)}
