"""The admin API's pool policy: ``llmq config show``, ``set``, ``unset`` and ``history``.

The same functions as the command (:mod:`llmq.policy.store`): a change is validated
whole and written by compare-and-set, or refused (400, ``param`` naming the key)
with nothing changed and the version as it was. A change made here is in the
policy's history under the admin key's name, and in the audit trail.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from api.admin import REFUSALS, AdminCaller, audit
from api.errors import InvalidRequest
from api.openapi import error_responses
from api.state import AppState, State
from llmq import registry
from llmq.policy import store
from llmq.policy.fields import POLICY_NAMES
from llmq.policy.model import Effective, PolicyError
from llmq.protocol import policy as stored_policy
from llmq.protocol.policy import HISTORY_MAXLEN

router = APIRouter(prefix="/admin", tags=["admin"])

#: A model named in ``?model=``: what a worker may be registered under.
MODEL_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,199}$"

ModelQuery = Annotated[str | None, Query(pattern=MODEL_PATTERN, max_length=200)]


class PolicyChange(BaseModel):
    """Keys to set (JSON values, as each field takes them) and keys to remove, in the
    pool's document or, with ``?model=``, the model's overrides; one change."""

    model_config = ConfigDict(extra="forbid")

    set: dict[str, Any] = Field(default_factory=dict, max_length=len(POLICY_NAMES))
    unset: list[str] = Field(default_factory=list, max_length=len(POLICY_NAMES))


def _shown(found: Effective) -> dict[str, Any]:
    values = found.policy.model_dump(mode="json")
    return {name: {"value": values[name], "source": found.source(name)} for name in POLICY_NAMES}


async def _models(state: AppState, overridden: set[str]) -> list[str]:
    """The models worth showing: those with overrides, seen by the pool, or serving."""
    workers = await registry.live_workers(state.redis, store.DECLARED_SECONDS)
    known = await stored_policy.known_models(state.redis)
    return sorted(overridden | known | {w.model for w in workers})


def _param(message: str, names: list[str]) -> str | None:
    """The key a refusal names: of the change's keys, the first in its message."""
    found = [
        (m.start(), name)
        for name in names
        if (m := re.search(rf"(?<!\w){re.escape(name)}(?!\w)", message))
    ]
    return min(found)[1] if found else None


@router.get("/policy", responses=error_responses(*REFUSALS))
async def show(state: State, _: AdminCaller) -> dict[str, Any]:
    """The effective policy of the pool and of each model, every value with its source
    (default, derived, pool, model); the version; the models with overrides and their
    documents as stored."""
    stored = await stored_policy.read(state.redis)
    declared = await store.declared(state.redis)
    models = {
        model: _shown(store.effective_of(stored, model, declared.get(model, {})))
        for model in await _models(state, set(stored.models))
    }
    return {
        "object": "policy",
        "version": stored.version,
        "pool": _shown(store.effective_of(stored, None, {})),
        "models": models,
        "overridden": sorted(stored.models),
        "stored": {"pool": stored.pool, "models": stored.models},
    }


async def _change(
    state: AppState, who: AdminCaller, body: PolicyChange, model: str | None
) -> dict[str, Any]:
    if not body.set and not body.unset:
        raise InvalidRequest(
            "nothing to change: give set or unset", param="set", code="invalid_value"
        )
    names = [*body.set, *body.unset]
    try:
        version = await store.change(state.redis, body.set, body.unset, model, who.name)
    except PolicyError as exc:
        raise InvalidRequest(
            str(exc), param=_param(str(exc), names), code="invalid_value"
        ) from None
    changed = {"set": body.set, "unset": body.unset, "version": version}
    await audit(state, who, "policy.change", model or "pool", **changed)
    return {"object": "policy.change", "scope": model or "pool", **changed}


@router.patch("/policy", responses=error_responses(*REFUSALS, 400))
async def patch(
    body: PolicyChange, state: State, who: AdminCaller, model: ModelQuery = None
) -> dict[str, Any]:
    """Set and unset keys of the pool's policy (``llmq config set``/``unset``), or of a
    model's overrides with ``?model=``; the new version."""
    return await _change(state, who, body, model)


@router.put("/policy", responses=error_responses(*REFUSALS, 400))
async def put(
    body: PolicyChange, state: State, who: AdminCaller, model: ModelQuery = None
) -> dict[str, Any]:
    """The same as ``PATCH``: keys named are set or unset, the others kept."""
    return await _change(state, who, body, model)


@router.get("/policy/history", responses=error_responses(*REFUSALS, 400))
async def history(
    state: State,
    _: AdminCaller,
    limit: Annotated[int, Query(ge=1, le=min(HISTORY_MAXLEN, 100))] = 20,
) -> dict[str, Any]:
    """The newest changes first (``llmq config history``): version, when, who, what."""
    found = await store.history(state.redis, limit)
    return {
        "object": "list",
        "data": [
            {"version": c.version, "at": c.at_ms / 1000, "who": c.who, "what": c.what}
            for c in reversed(found)
        ],
    }
