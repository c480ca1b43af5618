"""The batch feeder: runs batches on the pool's idle capacity, exactly once per line.

Every API process runs :meth:`BatchFeeder.run_forever`; one at a time holds the
feeder's lease (:data:`llmq.protocol.keys.BATCH_FEEDER`, ``LLMQ_ORPHAN_GRACE_SECONDS``
long, renewed each step) and does the work; when it dies another takes over after
the lease, from the state in Redis alone. Each step, for each active batch:

1. **Feed**: while no interactive request waits in the model's queue, take as many
   lines as the model's parked workers have free slots, plus ``LLMQ_BATCH_LOOKAHEAD``
   less the batch lines already waiting (``batch_take.lua``: each becomes *running*,
   with its line), and enqueue each in the batch band (:mod:`api.batch.batch_run`). An idle
   pool gets a line per free slot by hand-off and the next ones from the queue as
   slots free; a busy one gets none, and the queue never holds more than the
   lookahead of batch lines. A line whose enqueue was refused for now (queue full,
   no worker) stays running without requests and is fed again later.
2. **Collect**: a task per running line reads its requests' answer from their
   streams (the live endpoints' code) and records it exactly once by ``custom_id``
   (``batch_result.lua``): a second collection, by a feeder that took over, or of a
   re-run, changes nothing.
3. **End**: a batch past its completion window is stopped (``ending`` = expired,
   status ``finalizing``); a cancelled one is ``cancelling``. Their running lines'
   requests are cancelled (the cancel path of every request: a worker stops at its
   next token), and their lines that never ran go to the error file
   (``batch_expired``, ``batch_cancelled``). Once no line runs, the output and error
   files are assembled, once (their ids are kept in the batch), and the batch ends
   ``completed``, ``expired`` or ``cancelled``; its lines and results are then deleted
   (:func:`api.batch.batch_store.ended`).

A process that stops (SIGTERM) hands its feeding over (:meth:`BatchFeeder.hand_over`):
it ends the step under way, stops its collections without recording them, and gives
up the lease, so that another process (or itself, restarted) takes over at once and
collects the same lines again from their streams: their requests run on without it.

Every collection is a task the feeder owns: one that fails is logged once, in one
line, and collected again by a later step; all are cancelled and awaited when the
feeder stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from typing import Any, NoReturn, cast

from api.batch import batch_run, batch_store, files
from api.batch.batch_store import BatchObject
from api.errors import ApiError
from api.state import AppState
from llmq import metrics
from llmq.protocol import batches, keys
from llmq.protocol.streams import add_lifecycle
from llmq.schema import Lifecycle
from llmq.tasks import run_periodically, stop_tasks

log = logging.getLogger(__name__)

#: Statuses an enqueue refusal may clear by itself: the line is fed again later.
RETRYABLE = frozenset({429, 503})

#: How long a hand-over waits for the step under way, and then for Redis to release
#: the lease: a stopping process is not held up longer by a Redis that does not answer.
HAND_OVER_SECONDS = 2.0


class BatchFeeder:
    """The feeding, collecting and ending of batches by one API process (see above)."""

    def __init__(self, state: AppState) -> None:
        self.state = state
        self.redis = state.redis
        self.collecting: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.cancelled: set[str] = set()
        #: The status and counts of each batch's last lifecycle note.
        self.noted: dict[str, tuple[str, int, int]] = {}
        #: Set when the process stops: no step, collection or record from then on.
        self.handing_over = False
        #: Held by a step, so that a hand-over waits for the one under way.
        self.stepping = asyncio.Lock()

    async def run_forever(self) -> NoReturn:
        try:
            await run_periodically(
                self.step, self.state.settings.batch_feed_seconds, what="batch feeder", logger=log
            )
        finally:
            await stop_tasks(list(self.collecting.values()), timeout=2)

    async def hand_over(self) -> None:
        """Stop feeding and give the batches to another process at once: the step
        under way ends (no line is left fed but unnoted), the collections stop unrecorded
        (their lines' requests run on, and the next feeder collects their answers from
        their streams), and the lease is given up. Called on SIGTERM, before the open
        streams are ended, and again (a no-op by then) when the app stops."""
        self.handing_over = True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(HAND_OVER_SECONDS), self.stepping:
                pass
        await stop_tasks(list(self.collecting.values()), timeout=HAND_OVER_SECONDS)
        try:
            async with asyncio.timeout(HAND_OVER_SECONDS):
                released = await batches.lease(self.redis, self.state.process_id, 0)
        except Exception as exc:  # it then lapses after LLMQ_ORPHAN_GRACE_SECONDS
            log.warning("batch feeder: could not give up the lease: %r", exc)
            return
        if released:
            log.info("batch feeder: handed over (lease given up)")

    async def step(self) -> None:
        async with self.stepping:
            if not self.handing_over:
                await self._step()

    async def _step(self) -> None:
        listed = await self.redis.zrange(keys.BATCHES_ACTIVE, 0, -1, withscores=True)
        ms = int(self.state.settings.orphan_grace_seconds * 1000)
        if not listed or not await batches.lease(self.redis, self.state.process_id, ms):
            return  # nothing to feed (no lease taken), or another process feeds
        rooms: dict[str, int] = {}
        for raw, created in listed:
            batch = await batch_store.load(self.redis, str(raw))
            if batch is None:
                # listed before it is written (api/batch/batch_store.py): dropped once stale
                if time.time() - created > batch_store.UNWRITTEN_SECONDS:
                    await self.redis.zrem(keys.BATCHES_ACTIVE, str(raw))
                continue
            await self._advance(batch, rooms)

    async def _progress(self, batch: BatchObject) -> None:
        """A lifecycle note (``batch``) when the batch's status or counts moved."""
        counts = batch.request_counts
        seen = (batch.status, counts.get("completed", 0), counts.get("failed", 0))
        if self.noted.get(batch.id) == seen:
            return
        self.noted[batch.id] = seen
        note = Lifecycle(
            event="batch",
            request_id=batch.id,
            model=batch.model,
            ts=time.time(),
            status=batch.status,
            completed=seen[1],
            failed=seen[2],
            total=batch.total,
        )
        pipe = self.redis.pipeline(transaction=False)
        add_lifecycle(pipe, note, maxlen=self.state.policy.pool().lifecycle_maxlen)
        await pipe.execute()

    async def _advance(self, batch: BatchObject, rooms: dict[str, int]) -> None:
        await self._progress(batch)
        if batch.status in batch_store.ENDED:
            await batch_store.ended(self.redis, batch.id, self._ttl())
            return
        if batch.status == "in_progress" and time.time() >= batch.expires_at:
            await self.redis.hset(keys.batch(batch.id), "ending", "expired")  # type: ignore[misc]
            await batch_store.move(self.redis, batch.id, "finalizing", since=("in_progress",))
            batch = await batch_store.load(self.redis, batch.id) or batch
        running = cast(
            dict[str, str], await cast("Any", self.redis.hgetall(keys.batch_running(batch.id)))
        )
        stopping = batch.status == "cancelling" or batch.ending is not None
        if stopping:
            await self._stop(batch, running)
            running = cast(
                dict[str, str], await cast("Any", self.redis.hgetall(keys.batch_running(batch.id)))
            )
        else:
            await self._follow(batch, running, rooms)
        if batch.status == "in_progress":
            fed = int(await cast("Any", self.redis.hget(keys.batch(batch.id), "next")) or 0)
            left = await cast("Any", self.redis.hlen(keys.batch_running(batch.id)))
            if fed >= batch.total and not left:
                await batch_store.move(self.redis, batch.id, "finalizing", since=("in_progress",))
            return
        if not running and batch.status in ("finalizing", "cancelling"):
            await self._finish(batch)

    async def _follow(
        self, batch: BatchObject, running: dict[str, str], rooms: dict[str, int]
    ) -> None:
        """Collect every running line, feed again the ones left unfed, and feed new ones."""
        if batch.model not in rooms:
            rooms[batch.model] = await batches.room(
                self.redis, batch.model, self.state.policy.of(batch.model).batch_lookahead
            )
        unfed: list[tuple[str, dict[str, Any]]] = []
        for custom_id, raw in running.items():
            entry = json.loads(raw)
            if entry.get("subs"):
                self.collect(batch, custom_id, entry)
            elif (batch.id, custom_id) not in self.collecting:
                unfed.append((custom_id, entry))
        for custom_id, entry in unfed:
            if rooms[batch.model] <= 0:
                return
            rooms[batch.model] -= 1
            await self._feed(batch, custom_id, entry)
        if batch.status != "in_progress" or rooms[batch.model] <= 0:
            return
        taken = await batches.take(self.redis, batch.id, rooms[batch.model])
        rooms[batch.model] -= len(taken)
        for raw in taken:
            line = json.loads(raw)
            await self._feed(batch, line["custom_id"], {"line": line})

    async def _feed(self, batch: BatchObject, custom_id: str, entry: dict[str, Any]) -> None:
        line = entry["line"]
        try:
            subs = await batch_run.submit_line(self.state, batch, line["body"])
        except ApiError as exc:
            if exc.status in RETRYABLE:
                return  # stays running without requests: fed again by a later step
            await self._record(batch, custom_id, False, _refused(custom_id, exc))
            return
        entry = {"line": line, "subs": json.loads(batch_run.encode_subs(subs))}
        await self.redis.hset(  # type: ignore[misc]
            keys.batch_running(batch.id), custom_id, json.dumps(entry)
        )
        self.collect(batch, custom_id, entry)

    def collect(self, batch: BatchObject, custom_id: str, entry: dict[str, Any]) -> None:
        """Collect a running line (``entry``: its line and requests) in a task of its own,
        unless one collects it already; the task's end is seen by :meth:`_collect_ended`."""
        key = (batch.id, custom_id)
        if key in self.collecting or self.handing_over:
            return
        task = asyncio.create_task(
            self._collected(batch, custom_id, entry), name=f"collect {batch.id} {custom_id}"
        )
        self.collecting[key] = task
        task.add_done_callback(functools.partial(self._collect_ended, key))

    def _collect_ended(self, key: tuple[str, str], task: asyncio.Task[None]) -> None:
        """A collection ended: forgotten, and its failure (Redis lost, say) logged in one
        line; the line is still running, so a later step collects it again."""
        if self.collecting.get(key) is task:
            del self.collecting[key]
        if task.cancelled() or (exc := task.exception()) is None:
            return
        log.warning("batch %s: collecting line %s failed, collected again later: %r", *key, exc)

    async def _collected(self, batch: BatchObject, custom_id: str, entry: dict[str, Any]) -> None:
        subs = batch_run.decode_subs(json.dumps(entry["subs"]))
        try:
            status, body = await batch_run.collect_line(
                self.state, batch, entry["line"]["body"], subs
            )
        except ApiError as exc:
            status, body = exc.status, exc.body()
        if status != 200 or await self._any_cancelled(subs):
            current = await batch_store.load(self.redis, batch.id)
            if current is not None and (current.status == "cancelling" or current.ending):
                # stopped by the batch's own end: not an answer, a line that did not run
                ending = "cancelled" if current.status == "cancelling" else current.ending
                await self._record(batch, custom_id, False, _unrun(custom_id, str(ending)))
                return
        line = batch_run.output_line(custom_id, subs, status, body)
        await self._record(batch, custom_id, status == 200, line)

    async def _any_cancelled(self, subs: list[batch_run.Submitted]) -> bool:
        """Whether a request of the line was cancelled (its answer is then partial)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for sub in subs:
                pipe.hget(keys.request(sub.id), "status")
            return "cancelled" in await pipe.execute()

    async def _record(self, batch: BatchObject, custom_id: str, ok: bool, line: str) -> None:
        if self.handing_over:
            return  # the process stops (its streams may end early): the next feeder records
        if await batches.record(self.redis, batch.id, custom_id, line, ok=ok):
            outcome = "completed" if ok else "failed"
            self.state.metrics.inc(metrics.BATCH_LINES, batch.model, outcome)

    async def _stop(self, batch: BatchObject, running: dict[str, str]) -> None:
        """Cancel the running lines' requests, and end the lines that never ran."""
        ending = "cancelled" if batch.status == "cancelling" else str(batch.ending)
        for custom_id, raw in running.items():
            entry = json.loads(raw)
            if not entry.get("subs"):
                await self._record(batch, custom_id, False, _unrun(custom_id, ending))
                continue
            self.collect(batch, custom_id, entry)
            for sub in entry["subs"]:
                if sub["id"] not in self.cancelled:
                    self.cancelled.add(sub["id"])
                    await self.state.queue.cancel(batch.model, sub["id"])
        fed = int(await cast("Any", self.redis.hget(keys.batch(batch.id), "next")) or 0)
        if fed < batch.total:
            await self.redis.hset(keys.batch(batch.id), "next", str(batch.total))  # type: ignore[misc]
            for raw in await cast("Any", self.redis.lrange(keys.batch_lines(batch.id), fed, -1)):
                custom_id = json.loads(raw)["custom_id"]
                await self._record(batch, custom_id, False, _unrun(custom_id, ending))

    async def _finish(self, batch: BatchObject) -> None:
        """Assemble the output and error files once, then end the batch."""
        batch_key = keys.batch(batch.id)
        for field, source in (
            ("output_file_id", keys.batch_output(batch.id)),
            ("error_file_id", keys.batch_errors(batch.id)),
        ):
            if await cast("Any", self.redis.hexists(batch_key, field)):
                continue
            lines = await cast("Any", self.redis.hvals(source))
            if not lines:
                continue
            made = await files.save(
                self.redis,
                content="".join(f"{line}\n" for line in lines),
                filename=f"{batch.id}_{field.removesuffix('_file_id')}.jsonl",
                purpose="batch_output",
                owner=batch.owner,
                ttl_seconds=self._ttl(),
            )
            if not await cast("Any", self.redis.hsetnx(batch_key, field, made.id)):
                with contextlib.suppress(ApiError):  # another feeder made it first
                    await files.delete(self.redis, made.id, batch.owner)
        final: batch_store.Status = "completed"
        since = ("finalizing",)
        if batch.status == "cancelling":
            final, since = "cancelled", ("cancelling",)
        elif batch.ending == "expired":
            final = "expired"
        if await batch_store.move(self.redis, batch.id, final, since=since):
            log.info("batch %s %s", batch.id, final)
            ended = await batch_store.load(self.redis, batch.id)
            if ended is not None:
                await self._progress(ended)
            self.noted.pop(batch.id, None)
            self.state.metrics.inc(metrics.BATCHES, batch.model, final)
        await batch_store.ended(self.redis, batch.id, self._ttl())

    def _ttl(self) -> int:
        """How long an ended batch and its files are kept: pool policy, read live."""
        return self.state.policy.pool().batch_ttl_seconds


def _refused(custom_id: str, exc: ApiError) -> str:
    """The error line of a line whose enqueue was refused for good (its own fault)."""
    return json.dumps(
        {
            "id": f"batch_req_{custom_id}",
            "custom_id": custom_id,
            "response": {"status_code": exc.status, "request_id": None, "body": exc.body()},
            "error": None,
        }
    )


def _unrun(custom_id: str, ending: str) -> str:
    what = "expired" if ending == "expired" else "cancelled"
    message = (
        "the request could not be run before the completion window expired"
        if what == "expired"
        else "the batch was cancelled before the request finished"
    )
    return batch_run.error_line(custom_id, f"batch_{what}", message)
