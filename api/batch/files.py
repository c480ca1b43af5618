"""Files of the Batch API, stored in Redis so that every API process reads them.

A file is one hash (:func:`llmq.protocol.keys.file`): its OpenAI file object and
its text. Uploads are bounded (``LLMQ_BATCH_MAX_FILE_BYTES``, checked again by
:class:`api.admission.limits.BodyLimit` before the body is parsed) and every file expires
after ``LLMQ_BATCH_TTL_SECONDS``, as OpenAI's batch files do. A file is visible to
the key that made it only (its *owner*, :func:`api.admission.auth.owner_of`); another key
gets 404, as if it did not exist. Output and error files of a batch are made here
too, owned by the batch's owner.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal, cast

from pydantic import BaseModel
from redis.asyncio import Redis

from api.errors import NotFound
from llmq.protocol import keys

#: OpenAI's purposes that a file here may have.
Purpose = Literal["batch", "batch_output"]


class FileObject(BaseModel):
    """OpenAI's file object (``client.files.retrieve``)."""

    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    expires_at: int | None = None
    filename: str
    purpose: Purpose
    status: Literal["processed"] = "processed"
    #: The owner's digest (not part of OpenAI's object: left out of answers).
    owner: str | None = None

    def public(self) -> dict[str, Any]:
        return self.model_dump(exclude={"owner"})


def owner_key(owner: str | None) -> str:
    return owner or "-"


async def save(
    redis: Redis,
    *,
    content: str,
    filename: str,
    purpose: Purpose,
    owner: str | None,
    ttl_seconds: int,
) -> FileObject:
    """Store a file and index it under its owner; its object."""
    now = int(time.time())
    meta = FileObject(
        id=f"file-{uuid.uuid4().hex}",
        bytes=len(content.encode()),
        created_at=now,
        expires_at=now + ttl_seconds,
        filename=filename,
        purpose=purpose,
        owner=owner,
    )
    index = keys.files_of(owner_key(owner))
    async with redis.pipeline(transaction=False) as pipe:
        pipe.hset(keys.file(meta.id), mapping={"meta": meta.model_dump_json(), "content": content})
        pipe.expire(keys.file(meta.id), ttl_seconds)
        pipe.zadd(index, {meta.id: now})
        pipe.expire(index, ttl_seconds)
        await pipe.execute()
    return meta


async def find(redis: Redis, file_id: str, owner: str | None) -> FileObject:
    """The file's object; 404 if it does not exist (or expired) or is another key's."""
    raw = await cast("Any", redis.hget(keys.file(file_id), "meta"))
    meta = None if raw is None else FileObject.model_validate_json(raw)
    if meta is None or meta.owner != owner:
        raise NotFound(f"no file with id '{file_id}'", param="file_id", code="file_not_found")
    return meta


async def content(redis: Redis, file_id: str, owner: str | None) -> str:
    await find(redis, file_id, owner)
    text = await cast("Any", redis.hget(keys.file(file_id), "content"))
    if text is None:  # expired between the two reads
        raise NotFound(f"no file with id '{file_id}'", param="file_id", code="file_not_found")
    return cast(str, text)


async def listed(
    redis: Redis, owner: str | None, *, purpose: str | None, after: str | None, limit: int
) -> tuple[list[FileObject], bool]:
    """The owner's files, newest first, after the id ``after``; and whether more follow."""
    index = keys.files_of(owner_key(owner))
    ids = [str(i) for i in await redis.zrevrange(index, 0, -1)]
    if after is not None and after in ids:
        ids = ids[ids.index(after) + 1 :]
    found: list[FileObject] = []
    gone: list[str] = []
    for file_id in ids:
        raw = await cast("Any", redis.hget(keys.file(file_id), "meta"))
        if raw is None:
            gone.append(file_id)
            continue
        meta = FileObject.model_validate_json(raw)
        if purpose is None or meta.purpose == purpose:
            found.append(meta)
        if len(found) > limit:
            break
    if gone:  # expired files leave the index lazily
        await redis.zrem(index, *gone)
    return found[:limit], len(found) > limit


async def delete(redis: Redis, file_id: str, owner: str | None) -> None:
    await find(redis, file_id, owner)
    async with redis.pipeline(transaction=False) as pipe:
        pipe.delete(keys.file(file_id))
        pipe.zrem(keys.files_of(owner_key(owner)), file_id)
        await pipe.execute()
