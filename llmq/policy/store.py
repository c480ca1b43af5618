"""Reading and changing the pool policy: what ``llmq config`` (and an admin endpoint)
call.

Every change is validated whole before it is written: each layer's values for their
fields, and the effective policy of the pool and of every model with overrides
together (a change that would leave a model's ``min_priority`` above its
``max_priority`` is refused), then written by compare-and-set on the version
(:func:`llmq.protocol.policy.write`): a change that lost the race to another is
validated and made again from the new version, so no change is lost. After a write
each model's version floor is raised (its claims' floor). A refusal raises
:class:`~llmq.policy.model.PolicyError` and changes nothing.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from llmq import registry
from llmq.policy.derived import derive
from llmq.policy.fields import POLICY_NAMES
from llmq.policy.model import Doc, Effective, PolicyError, check_doc, layered
from llmq.protocol import policy as stored_policy
from llmq.protocol.policy import POOL, Change, Stored, model_field
from llmq.tenants import located

#: Compare-and-set attempts before a change gives up (each lost to another change).
ATTEMPTS = 20

Docs = dict[str, dict[str, Any]]

#: How old a worker's beat may be for its declaration to count in ``show``.
DECLARED_SECONDS = 10.0


async def declared(redis: Redis, ttl_seconds: float = DECLARED_SECONDS) -> Docs:
    """Per model, the values derived from its live workers' declarations."""
    return derive(await registry.live_workers(redis, ttl_seconds))


def effective_of(stored: Stored, model: str | None, derived: Doc) -> Effective:
    """A model's effective policy (None: the pool's, without a model's overrides)."""
    overrides = stored.models.get(model, {}) if model else {}
    return layered(derived, stored.pool, overrides, stored.version)


async def show(redis: Redis, model: str | None = None) -> Effective:
    stored = await stored_policy.read(redis)
    derived = (await declared(redis)).get(model, {}) if model else {}
    return effective_of(stored, model, derived)


def _check_all(pool: Doc, models: Mapping[str, Doc]) -> None:
    """Every layer valid, and the pool's and each model's policy valid as a whole."""
    check_doc(pool, "pool: ")
    layered({}, pool, {}, where="pool: ")
    for name, doc in models.items():
        check_doc(doc, f"model {name}: ")
        layered({}, pool, doc, where=f"model {name}: ")


Edit = Callable[[dict[str, Any], dict[str, dict[str, Any]]], str]


async def _change(redis: Redis, edit: Edit, who: str) -> int:
    """Apply ``edit`` (which changes copies of the pool's and the models' documents in
    place and returns what it did) from the current version, validate, write by
    compare-and-set, again from the new version if another change came first."""
    for _ in range(ATTEMPTS):
        stored = await stored_policy.read(redis)
        pool = dict(stored.pool)
        models = {m: dict(d) for m, d in stored.models.items()}
        what = edit(pool, models)
        _check_all(pool, models)
        docs: dict[str, Doc | None] = {POOL: pool}
        for name in set(stored.models) | set(models):
            docs[model_field(name)] = models.get(name)
        version = await stored_policy.write(redis, stored.version, docs, who=who, what=what)
        if version is not None:
            await _publish(redis, set(stored.models) | set(models), version)
            return version
    raise PolicyError("the policy kept changing meanwhile; try again")


async def _publish(redis: Redis, overridden: set[str], version: int) -> None:
    workers = await registry.live_workers(redis, DECLARED_SECONDS)
    models = overridden | await stored_policy.known_models(redis) | {w.model for w in workers}
    await stored_policy.publish(redis, models, version)


def _doc(pool: dict[str, Any], models: Docs, model: str | None) -> dict[str, Any]:
    return pool if model is None else models.setdefault(model, {})


def _scope(model: str | None) -> str:
    return "pool" if model is None else f"model {model}"


async def set_values(redis: Redis, values: Mapping[str, Any], model: str | None, who: str) -> int:
    """Set values (text from a command line: :func:`~llmq.policy.model.parse_value`)
    in the pool's document or a model's; the new version."""
    return await change(redis, values, [], model, who)


async def unset(redis: Redis, names: list[str], model: str | None, who: str) -> int:
    """Remove values from the pool's document or a model's (the layer below shows
    again); the new version."""
    return await change(redis, {}, names, model, who)


async def change(
    redis: Redis, values: Mapping[str, Any], names: list[str], model: str | None, who: str
) -> int:
    """Set ``values`` and remove ``names`` in the pool's document or a model's, as one
    change (all of it or, refused, none of it); the new version."""
    parsed = check_doc(values, "" if model is None else f"model {model}: ")
    unknown = [name for name in names if name not in POLICY_NAMES]
    if unknown:
        raise PolicyError(f"{unknown[0]}: unknown setting")

    def edit(pool: dict[str, Any], models: dict[str, dict[str, Any]]) -> str:
        doc = _doc(pool, models, model)
        for name in names:
            doc.pop(name, None)
        doc.update(parsed)
        if model is not None and not doc:
            models.pop(model, None)
        what: dict[str, Any] = {"scope": _scope(model)}
        if parsed:
            what["set"] = parsed
        if names:
            what["unset"] = names
        return json.dumps(what, sort_keys=True)

    return await _change(redis, edit, who)


def read_file(path: str | Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The pool's and the models' documents of a TOML policy file, all valid, or
    :class:`PolicyError` naming the line, table and key of the first thing wrong::

        [pool]
        routing = "prefix"

        [models.llama-70b]
        max_queue_depth = 200
    """
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise PolicyError(f"{path}: {exc}") from None
    unknown = sorted(set(data) - {"pool", "models"})
    if unknown:
        raise PolicyError(located(path, unknown[0], "", "unknown table: [pool] and [models.NAME]"))
    pool = data.get("pool", {})
    models = data.get("models", {})
    tables: list[tuple[str, Any]] = [("pool", pool)]
    tables += [(f"models.{m}", d) for m, d in models.items()]
    for table, doc in tables:
        if not isinstance(doc, dict):
            raise PolicyError(located(path, table, "", "must be a table"))
        try:
            check_doc(doc)
        except PolicyError as exc:
            key, _, msg = str(exc).partition(": ")
            if key not in doc:  # not one key's: the table as a whole
                key, msg = "", str(exc)
            raise PolicyError(located(path, table, key, msg)) from None
    for name, doc in models.items():
        try:
            layered({}, pool, doc)
        except PolicyError as exc:
            raise PolicyError(located(path, f"models.{name}", "", str(exc))) from None
    try:
        layered({}, pool, {})
    except PolicyError as exc:
        raise PolicyError(located(path, "pool", "", str(exc))) from None
    return check_doc(pool), {m: check_doc(d) for m, d in models.items()}


async def load(redis: Redis, path: str | Path, who: str) -> int:
    """Make the policy what the file says, whole (models it does not name lose their
    overrides); the new version."""
    pool_doc, model_docs = read_file(path)

    def edit(pool: dict[str, Any], models: dict[str, dict[str, Any]]) -> str:
        pool.clear()
        pool.update(pool_doc)
        models.clear()
        models.update({m: dict(d) for m, d in model_docs.items() if d})
        return json.dumps({"scope": "all", "load": str(path)})

    return await _change(redis, edit, who)


async def diff(redis: Redis, path: str | Path) -> list[str]:
    """What loading the file would change: ``scope key: now -> then`` lines."""
    pool_doc, model_docs = read_file(path)
    stored = await stored_policy.read(redis)
    lines: list[str] = []
    pairs = [("pool", stored.pool, pool_doc)] + [
        (f"models.{m}", stored.models.get(m, {}), model_docs.get(m, {}))
        for m in sorted(set(stored.models) | set(model_docs))
    ]
    for scope, now, then in pairs:
        for name in sorted(set(now) | set(then)):
            if now.get(name, _ABSENT) != then.get(name, _ABSENT):
                lines.append(f"{scope} {name}: {_shown(now, name)} -> {_shown(then, name)}")
    return lines


_ABSENT = object()


def _shown(doc: Doc, name: str) -> str:
    return json.dumps(doc[name]) if name in doc else "(unset)"


async def seed(redis: Redis, values: Doc, who: str) -> int | None:
    """Write the first policy of a pool from a process's environment, once: the new
    version, or None where the pool has one (nothing written). Invalid values are
    refused (:class:`PolicyError`)."""
    pool = check_doc(values, "environment: ")
    layered({}, pool, {}, where="environment: ")
    what = json.dumps({"scope": "pool", "seed": pool}, sort_keys=True)
    version = await stored_policy.write(redis, 0, {POOL: pool}, who=who, what=what)
    if version is not None:
        await _publish(redis, set(), version)
    return version


async def history(redis: Redis, count: int = 20) -> list[Change]:
    return await stored_policy.history(redis, count)
