"""Stored responses: what ``GET /v1/responses/{id}`` returns and ``previous_response_id``
continues.

Each is one JSON value under :func:`llmq.protocol.keys.stored_response`, in its
request's slot, kept as long as the request's own keys (the pool policy's
``request_ttl_seconds``, as it is when the response is stored).
It holds the Response object and the conversation that led to it as chat
messages (the instructions excluded: they do not carry over to the next turn),
so a follow-up turn is the stored conversation plus its own input. Only the key
that made a response may read or continue it; any other gets a 404, as if it did
not exist.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError
from redis.asyncio import Redis

from llmq.protocol import keys

#: Response ids are the request id with this prefix.
ID_PREFIX = "resp_"


class StoredResponse(BaseModel):
    owner: str | None = None
    response: dict[str, Any]
    conversation: list[dict[str, Any]]


def request_id_of(response_id: str) -> str | None:
    """The request id behind a response id (None: not one of ours)."""
    if not response_id.startswith(ID_PREFIX):
        return None
    rid = response_id[len(ID_PREFIX) :]
    return rid if rid and "{" not in rid and "}" not in rid else None


async def save(redis: Redis, stored: StoredResponse, ttl_seconds: int) -> None:
    rid = request_id_of(str(stored.response["id"]))
    if rid is None:
        raise ValueError(f"not a response id: {stored.response['id']!r}")
    await redis.set(keys.stored_response(rid), stored.model_dump_json(), ex=ttl_seconds)


async def load(redis: Redis, response_id: str, owner: str | None) -> StoredResponse | None:
    """The stored response, or None if it is absent, expired or another key's."""
    rid = request_id_of(response_id)
    if rid is None:
        return None
    raw = await redis.get(keys.stored_response(rid))
    if raw is None:
        return None
    try:
        stored = StoredResponse.model_validate_json(raw)
    except ValidationError:
        return None
    return stored if stored.owner == owner else None


async def delete(redis: Redis, response_id: str, owner: str | None) -> bool:
    rid = request_id_of(response_id)
    if rid is None or await load(redis, response_id, owner) is None:
        return False
    return bool(await redis.delete(keys.stored_response(rid)))
