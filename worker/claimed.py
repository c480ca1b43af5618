"""Handing arq the job record the claim script already read, without a round trip.

arq's ``Worker.run_job`` starts by reading the job record and bumping its try
counter in one pipeline: a Redis round trip on the path of every request, between
the claim and the model's first step (what pickup costs is in docs/benchmarks.md,
"Light load, pickup and recovery"). The claim script does both in its own atomic
step, so the worker hands the result to ``run_job`` instead: :class:`ClaimingRedis`
(the worker's arq pool) answers that one pipeline from what the claim returned,
when the running task carries a claim (:func:`carry`). Every other command, and
``run_job`` for a job that was not claimed by the script, goes to Redis as usual.

The stand-in accepts exactly the commands arq 0.28's ``run_job`` queues (GET of the
job, INCR and EXPIRE of its try counter, under arq's own key names) and fails
loudly on anything else, so an arq upgrade that changes them cannot silently skip
a read. Those names are arq's (``arq:job:<id>``), not where llmq keeps the job
(:func:`llmq.protocol.keys.job`, in the model's slot): with every run claimed by the script
and :class:`worker.queue_worker.QueueWorker` finishing jobs itself, arq never sends
them to Redis.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from arq.connections import ArqRedis
from arq.constants import job_key_prefix, retry_key_prefix


@dataclass(frozen=True)
class ClaimedJob:
    """What the claim script read for arq: the job record and the bumped try number."""

    request_id: str
    job: bytes | None
    job_try: int


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
        return [self._claimed.job, self._claimed.job_try, True]


class ClaimingRedis(ArqRedis):
    """The worker's arq pool: the carried claim answers ``run_job``'s first pipeline."""

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> Any:
        claimed = _CARRIED.get()
        if claimed is None:
            return super().pipeline(transaction, shard_hint)
        _CARRIED.set(None)  # one read only: later pipelines of the task are real
        return _ClaimedRead(claimed)
