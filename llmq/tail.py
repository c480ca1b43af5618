"""``llmq tail``: follow the lifecycle stream live in the terminal.

It reads the lifecycle streams (``llmq:lifecycle:{r:<k>}``, one per request group,
see :mod:`llmq.protocol.keys`) with a plain ``XREAD`` from the newest entry (or from the
oldest kept one with ``--from-start``), one line per state change (on a Redis
Cluster by polling, see :func:`_read`). Consumers that
must not miss entries across restarts should use a consumer group on each stream
instead (``XGROUP CREATE llmq:lifecycle:{r:0} NAME $ MKSTREAM`` then
``XREADGROUP``).
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any, TextIO

from pydantic import ValidationError
from redis.asyncio import Redis

from llmq.connection import connect, is_cluster
from llmq.protocol import keys
from llmq.schema import Lifecycle
from llmq.settings import CommonSettings

BLOCK_MS = 1000
#: How often the follower polls the streams of a Redis Cluster while nothing comes.
POLL_SECONDS = 0.2
#: Redis client name of the follower, visible in CLIENT LIST.
CLIENT_NAME = "llmq-tail"

_DETAILS = (
    "tenant", "worker", "attempt", "priority", "queue_ms", "ttft_ms", "e2e_ms",
    "direction", "reason", "actual", "target", "status", "completed", "failed", "total",
)  # fmt: skip


async def _read(
    redis: Redis, last: dict[str, str], cluster: bool
) -> list[tuple[str, tuple[str, dict[str, str]]]]:
    """The entries after ``last`` in every lifecycle stream, as (stream, entry).

    One blocking ``XREAD`` of all streams on a single Redis; on a Redis Cluster,
    where one read cannot span slots, a non-blocking read per stream in one
    pipeline (a round trip per node), every :data:`POLL_SECONDS` while idle, the
    entries put in id order.
    """
    if not cluster:
        reply = await redis.xread(dict(last), count=500, block=BLOCK_MS)  # type: ignore[arg-type]
        return [(key, entry) for key, entries in reply or [] for entry in entries]
    pipe = redis.pipeline(transaction=False)
    for key, at in last.items():
        pipe.xread({key: at}, count=500)
    found = [(k, e) for reply in await pipe.execute() for k, es in reply or [] for e in es]
    if not found:
        await asyncio.sleep(POLL_SECONDS)
    return sorted(found, key=lambda f: tuple(int(x) for x in f[1][0].split("-")))


def format_line(note: Lifecycle) -> str:
    stamp = time.strftime("%H:%M:%S", time.gmtime(note.ts)) + f".{int(note.ts % 1 * 1000):03d}"
    parts = [stamp, f"{note.event:<11}", note.request_id, note.model]
    for name in _DETAILS:
        value: Any = getattr(note, name)
        if value is not None:
            parts.append(f"{name}={value}")
    if note.finish_reason:
        parts.append(f"finish={note.finish_reason} tokens={note.completion_tokens}")
    return " ".join(parts)


async def tail_lifecycle(
    settings: CommonSettings,
    *,
    from_start: bool = False,
    limit: int | None = None,
    out: TextIO = sys.stdout,
) -> int:
    """Print entries until interrupted (or ``limit`` entries were printed)."""
    cluster = is_cluster(settings)
    redis: Redis = (
        connect(settings, max_connections=4)
        if cluster
        else Redis.from_url(
            settings.redis_url,
            decode_responses=True,
            client_name=CLIENT_NAME,
            socket_timeout=BLOCK_MS / 1000 + 5,
        )
    )
    # a non-blocking read has no "$": new entries are those after this moment
    start = "0-0" if from_start else ("$" if not cluster else f"{int(time.time() * 1000)}-0")
    last = dict.fromkeys(keys.LIFECYCLES, start)
    printed = 0
    try:
        while limit is None or printed < limit:
            for key, (entry_id, fields) in await _read(redis, last, cluster):
                last[key] = entry_id
                try:
                    note = Lifecycle.model_validate_json(fields.get("data", ""))
                except ValidationError:
                    continue  # a foreign or malformed entry
                print(format_line(note), file=out, flush=True)
                printed += 1
    finally:
        await redis.aclose(close_connection_pool=True)
    return 0
