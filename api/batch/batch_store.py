"""Batches in Redis: OpenAI's batch object, its status machine and its lines.

A batch is a hash (:func:`llmq.protocol.keys.batch`): ``meta`` holds what never
changes (:class:`BatchObject` as created), and the fields that do are their own:
``status`` and a ``<status>_at`` stamp per status reached (changed only by
``batch_status.lua``, which moves it from given statuses, so a cancel and the
feeder's finalizing cannot both win), ``completed`` and ``failed`` (bumped only by
``batch_result.lua``, once per ``custom_id``), ``next`` (the next line to feed),
``output_file_id``, ``error_file_id`` and ``ending`` (``expired`` or ``cancelled``:
how a batch that stops early ends). Its lines, the requests in flight and the
results share the batch's hash tag, and go when it ends (:func:`ended`). Statuses::

    validating -> failed                       (a bad line: nothing else is made)
    validating -> in_progress -> finalizing -> completed
                  in_progress -> finalizing -> expired     (completion window)
                  in_progress -> cancelling -> cancelled
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal, cast

from pydantic import BaseModel, Field
from redis.asyncio import Redis

from api.batch.files import owner_key
from api.errors import NotFound
from llmq.protocol import batches, keys

Status = Literal[
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "completed",
    "expired",
    "cancelling",
    "cancelled",
]
ENDED: frozenset[str] = frozenset({"failed", "completed", "expired", "cancelled"})
STAMPS = (
    "in_progress_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
)


#: How long a listed batch id may have no batch (its creation is under way) before
#: it counts as gone.
UNWRITTEN_SECONDS = 60.0


class LineError(BaseModel):
    """One entry of a failed batch's ``errors`` (OpenAI's ``BatchError``)."""

    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchObject(BaseModel):
    """OpenAI's batch object (``client.batches.retrieve``) and what llmq keeps beside it."""

    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: dict[str, Any] | None = None
    input_file_id: str
    completion_window: str
    status: Status = "validating"
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: dict[str, int] = Field(default_factory=dict)
    metadata: dict[str, str] | None = None
    #: Not OpenAI's (left out of answers): the owner's digest and the lines' model.
    owner: str | None = None
    model: str = ""
    #: How the batch ends if it stops early: ``expired`` or ``cancelled``.
    ending: str | None = None
    #: Not OpenAI's: the tenant of the key that created it, whose lines it sends
    #: (their quota and their share of the pool, docs/tenants.md).
    tenant: str | None = None

    def public(self) -> dict[str, Any]:
        return self.model_dump(exclude={"owner", "model", "ending", "tenant"})

    @property
    def total(self) -> int:
        return self.request_counts.get("total", 0)


def new_batch(
    *,
    endpoint: str,
    input_file_id: str,
    completion_window: str,
    window_seconds: int,
    metadata: dict[str, str] | None,
    owner: str | None,
    tenant: str | None = None,
) -> BatchObject:
    now = int(time.time())
    return BatchObject(
        id=f"batch_{uuid.uuid4().hex}",
        endpoint=endpoint,
        input_file_id=input_file_id,
        completion_window=completion_window,
        created_at=now,
        expires_at=now + window_seconds,
        metadata=metadata,
        owner=owner,
        tenant=tenant,
        request_counts={"total": 0, "completed": 0, "failed": 0},
    )


async def create(
    redis: Redis,
    batch: BatchObject,
    lines: list[str],
    ttl_seconds: int,
) -> None:
    """Store a validated batch (status ``in_progress``, its lines with it) or a failed
    one (``failed``, with its ``errors`` and no lines), in one transaction: nothing
    half-made. An active batch is listed for the feeder; an ended one expires."""
    now = int(time.time())
    fields: dict[str, Any] = {
        "meta": batch.model_dump_json(),
        "status": batch.status,
        "next": 0,
        "completed": 0,
        "failed": 0,
    }
    for stamp in STAMPS:
        value = getattr(batch, stamp)
        if value is not None:
            fields[stamp] = value
    index = keys.batches_of(owner_key(batch.owner))
    # Listed first: a crash before the batch itself is written leaves ids that the
    # feeder and the listings drop (their batch does not exist), never a batch
    # nobody feeds.
    async with redis.pipeline(transaction=False) as pipe:
        pipe.zadd(index, {batch.id: batch.created_at})
        pipe.expire(index, max(ttl_seconds, batch.expires_at - now + ttl_seconds))
        if batch.status not in ENDED:
            pipe.zadd(keys.BATCHES_ACTIVE, {batch.id: batch.created_at})
        await pipe.execute()
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hset(keys.batch(batch.id), mapping=fields)
        if lines:
            pipe.rpush(keys.batch_lines(batch.id), *lines)
        if batch.status in ENDED:
            pipe.expire(keys.batch(batch.id), ttl_seconds)
        await pipe.execute()


def _stamp(value: str | None) -> int | None:
    return None if value is None else int(float(value))


async def load(redis: Redis, batch_id: str) -> BatchObject | None:
    """The batch as it is now, or None if it does not exist (or expired)."""
    fields = cast(dict[str, str], await cast("Any", redis.hgetall(keys.batch(batch_id))))
    if "meta" not in fields:
        return None
    batch = BatchObject.model_validate_json(fields["meta"])
    update: dict[str, Any] = {stamp: _stamp(fields.get(stamp)) for stamp in STAMPS}
    update["status"] = fields.get("status", batch.status)
    update["output_file_id"] = fields.get("output_file_id")
    update["error_file_id"] = fields.get("error_file_id")
    update["ending"] = fields.get("ending")
    update["request_counts"] = {
        "total": batch.total,
        "completed": int(fields.get("completed", 0)),
        "failed": int(fields.get("failed", 0)),
    }
    return batch.model_copy(update=update)


async def find(redis: Redis, batch_id: str, owner: str | None) -> BatchObject:
    """The batch; 404 if it does not exist (or expired) or is another key's."""
    batch = await load(redis, batch_id)
    if batch is None or batch.owner != owner:
        raise NotFound(f"no batch with id '{batch_id}'", param="batch_id", code="batch_not_found")
    return batch


async def listed(
    redis: Redis, owner: str | None, *, after: str | None, limit: int
) -> tuple[list[BatchObject], bool]:
    """The owner's batches, newest first, after the id ``after``; and whether more follow."""
    index = keys.batches_of(owner_key(owner))
    listed = [(str(i), t) for i, t in await redis.zrevrange(index, 0, -1, withscores=True)]
    ids = [batch_id for batch_id, _ in listed]
    if after is not None and after in ids:
        listed = listed[ids.index(after) + 1 :]
    found: list[BatchObject] = []
    for batch_id, created in listed:
        batch = await load(redis, batch_id)
        if batch is None:
            if time.time() - created > UNWRITTEN_SECONDS:  # expired, or never written
                await redis.zrem(index, batch_id)
            continue
        found.append(batch)
        if len(found) > limit:
            break
    return found[:limit], len(found) > limit


async def move(redis: Redis, batch_id: str, status: Status, *, since: tuple[str, ...]) -> bool:
    """Move the batch to ``status`` if it is in one of ``since`` (``batch_status.lua``)."""
    return await batches.move(redis, batch_id, status, since=since)


async def ended(redis: Redis, batch_id: str, ttl_seconds: int) -> None:
    """An ended batch leaves the feeder's list and keeps only what its owner fetches:
    the batch (expiring after ``ttl_seconds``) and its files. Its copied lines and its
    results, already in the output and error files, are deleted; ``batch_result.lua``
    records nothing in an ended batch, so a late collector does not bring them back."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.zrem(keys.BATCHES_ACTIVE, batch_id)
        pipe.expire(keys.batch(batch_id), ttl_seconds)
        for key in (
            keys.batch_lines(batch_id),
            keys.batch_running(batch_id),
            keys.batch_output(batch_id),
            keys.batch_errors(batch_id),
        ):
            pipe.delete(key)
        await pipe.execute()
