"""The autoscaler's published state, read by the API (admission, ``/metrics``)."""

from __future__ import annotations

import logging
import time
from typing import cast

from pydantic import ValidationError
from redis.asyncio import Redis

from llmq.protocol import keys
from llmq.protocol.queue import as_str
from llmq.schema import ScaleState

log = logging.getLogger(__name__)


async def publish(redis: Redis, model: str, state: ScaleState) -> None:
    ttl_ms = max(int((state.expires_at - time.time()) * 1000), 1)
    pipe = redis.pipeline(transaction=True)
    pipe.hset(keys.AUTOSCALER_STATE, model, state.model_dump_json())
    pipe.pexpire(keys.AUTOSCALER_STATE, ttl_ms)
    await pipe.execute()


async def autoscaled(redis: Redis) -> dict[str, ScaleState]:
    """Models with a fresh entry: an autoscaler serves them right now."""
    now = time.time()
    states: dict[str, ScaleState] = {}
    entries = cast(dict[str, str], await redis.hgetall(keys.AUTOSCALER_STATE))  # type: ignore[misc]
    for raw_model, raw in entries.items():
        try:
            state = ScaleState.model_validate_json(raw)
        except ValidationError:
            log.warning("skipping a malformed autoscaler entry %r", raw[:200])
            continue
        if state.expires_at > now:
            states[as_str(raw_model)] = state
    return states


async def serves(redis: Redis, model: str) -> bool:
    """An autoscaler serves ``model``: its requests are accepted with no live worker."""
    raw = cast(str | None, await redis.hget(keys.AUTOSCALER_STATE, model))  # type: ignore[misc]
    if raw is None:
        return False
    try:
        return ScaleState.model_validate_json(raw).expires_at > time.time()
    except ValidationError:
        return False
