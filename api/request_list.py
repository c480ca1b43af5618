"""Every tenant's requests, as the admin API lists them: bounded pages, no prompts.

Redis keeps no index of all requests, and the request path must not pay for one;
the listing reads what exists already: each model's queue (queued requests, in the
order they will be claimed) and running set, and the newest entries of the lifecycle
streams (requests that ended). At most :data:`SCAN_MAX` ids are looked at per call
and at most :data:`PAGE_MAX` records returned, whatever the pool holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from api.state import AppState
from llmq.protocol import keys
from llmq.schema import Lifecycle, RequestRecord, Status
from llmq.tenants import text

#: The most records one page holds.
PAGE_MAX = 100

#: The most request ids one listing looks at, over all its sources.
SCAN_MAX = 1_000

#: How many of the newest entries of a request's lifecycle stream are searched for its own.
LIFECYCLE_SCAN = 2_000

#: The lifecycle events that end a request.
ENDINGS = frozenset({"finished", "cancelled", "failed"})

Source = Literal["queued", "running", "ended"]


async def _live(state: AppState, models: list[str], source: Source, cap: int) -> list[str]:
    key = keys.queue if source == "queued" else keys.running
    out: list[str] = []
    for model in models:
        if len(out) >= cap:
            break
        out += [text(i) for i in await state.redis.zrange(key(model), 0, cap - len(out) - 1)]
    return out


async def _ended(state: AppState, cap: int) -> list[str]:
    """The newest ended requests of every lifecycle stream, newest first."""
    async with state.redis.pipeline(transaction=False) as pipe:
        for stream in keys.LIFECYCLES:
            pipe.xrevrange(stream, count=max(1, cap // 8))
        replies = await pipe.execute()
    found: list[tuple[str, str]] = []
    for entries in replies:
        for entry_id, fields in entries:
            named = {text(k): text(v) for k, v in fields.items()}
            if named.get("event") in ENDINGS and named.get("request_id"):
                found.append((text(entry_id), named["request_id"]))
    found.sort(key=lambda f: tuple(int(x) for x in f[0].split("-")), reverse=True)
    return [rid for _, rid in found[:cap]]


def _sources(status: Status | None) -> list[Source]:
    if status is None:
        return ["queued", "running", "ended"]
    if status in ("queued", "running"):
        return [status]
    return ["ended"]


async def records(state: AppState, ids: list[str]) -> list[RequestRecord]:
    """The records of ``ids`` that exist and are whole, in order."""
    async with state.redis.pipeline(transaction=False) as pipe:
        for rid in ids:
            pipe.hgetall(keys.request(rid))
        replies = await pipe.execute()
    out = []
    for fields in replies:
        if not fields:
            continue
        try:
            out.append(RequestRecord.from_redis({text(k): text(v) for k, v in fields.items()}))
        except ValidationError:
            continue  # a record a failover left incomplete (see api.routes.native)
    return out


@dataclass(frozen=True)
class Page:
    """One page of a listing: its records, how many matched of the ids looked at, and
    whether those were all there were (False: :data:`SCAN_MAX` was reached)."""

    records: list[RequestRecord]
    matched: int
    complete: bool


async def listed(
    state: AppState,
    models: list[str],
    *,
    tenant: str | None,
    status: Status | None,
    limit: int,
) -> Page:
    """Up to ``limit`` requests of ``models`` that match: queued first (in queue order),
    then running, then the newest ended."""
    ids: dict[str, None] = {}  # ordered, once each
    for source in _sources(status):
        room = SCAN_MAX + 1 - len(ids)  # one more: whether there were more
        if room <= 0:
            break
        if source == "ended":
            found = await _ended(state, room)
        else:
            found = await _live(state, models, source, room)
        ids.update(dict.fromkeys(found))
    looked = list(ids)[:SCAN_MAX]
    matched = [
        r
        for r in await records(state, looked)
        if r.model in models
        and (tenant is None or r.tenant == tenant)
        and (status is None or r.status == status)
    ]
    return Page(matched[:limit], len(matched), len(ids) <= SCAN_MAX)


def summary(record: RequestRecord) -> dict[str, Any]:
    """What a listing shows of a request: never its prompt nor its owner."""
    return record.model_dump(exclude={"owner", "reserved"})


async def lifecycle(state: AppState, request_id: str) -> list[dict[str, Any]]:
    """The request's lifecycle entries (queued, started, first token, ended, each
    attempt), oldest first, among the newest :data:`LIFECYCLE_SCAN` of its group's."""
    found = await state.redis.xrevrange(keys.lifecycle(request_id), count=LIFECYCLE_SCAN)
    out = []
    for _, fields in reversed(found):
        named = {text(k): text(v) for k, v in fields.items()}
        if named.get("request_id") != request_id:
            continue
        try:
            note = Lifecycle.model_validate_json(named.get("data", ""))
        except ValidationError:
            continue
        out.append(note.model_dump(exclude_none=True, exclude={"request_id", "model"}))
    return out
