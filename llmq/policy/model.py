"""The pool policy as one validated object, and a model's effective policy.

A model's policy is layered: the built-in defaults, then what the pool derives from
its workers' declarations (:mod:`llmq.policy.derived`), then the pool-wide document,
then the model's own overrides; the last layer that sets a value wins, and
:class:`Effective` says which one that was, for ``llmq config show``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ConfigDict, ValidationError, model_validator

from llmq.policy.fields import POLICY_NAMES, PolicyFields

Source = Literal["default", "derived", "pool", "model"]

#: A layer of the policy: the values it sets, by field name.
Doc = Mapping[str, Any]


class PolicyError(ValueError):
    """A policy change refused, and why (nothing was changed)."""


class Policy(PolicyFields):
    """A complete, valid pool policy (every field: :class:`PolicyFields`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="after")
    def _priorities_ordered(self) -> Policy:
        if self.min_priority > self.max_priority:
            raise ValueError("min_priority must not exceed max_priority")
        return self


DEFAULT = Policy()


def _explain(exc: ValidationError, where: str) -> PolicyError:
    first = exc.errors(include_url=False)[0]
    loc = ".".join(str(p) for p in first["loc"])
    msg = "unknown setting" if first["type"] == "extra_forbidden" else first["msg"]
    return PolicyError(f"{where}{loc + ': ' if loc else ''}{msg}")


def check_doc(doc: Doc, where: str = "") -> dict[str, Any]:
    """A layer's values, each valid for its field (JSON-ready), or :class:`PolicyError`
    naming the first that is not."""
    try:
        Policy.model_validate(dict(doc))
    except ValidationError as exc:
        raise _explain(exc, where) from None
    checked = Policy.model_validate(dict(doc)).model_dump(mode="json")
    return {name: checked[name] for name in doc}


def parse_value(name: str, text: str) -> Any:
    """``KEY=VALUE``'s value as its field takes it (``none``/empty: unset, where the field
    may be unset), or :class:`PolicyError`."""
    if name not in POLICY_NAMES:
        raise PolicyError(f"{name}: unknown setting")
    raw: Any = text
    if text.lower() in ("none", "null", "") and DEFAULT.model_fields[name].default is None:
        raw = None
    try:
        return Policy.model_validate({name: raw}).model_dump(mode="json")[name]
    except ValidationError as exc:
        raise _explain(exc, "") from None


@dataclass(frozen=True)
class Effective:
    """A model's policy, the version it was read at, and where each value comes from."""

    policy: Policy = DEFAULT
    version: int = 0
    sources: dict[str, Source] = field(default_factory=dict)

    def source(self, name: str) -> Source:
        return self.sources.get(name, "default")


def layered(derived: Doc, pool: Doc, model: Doc, version: int = 0, where: str = "") -> Effective:
    """The effective policy of these layers (later ones win), or :class:`PolicyError`
    where together they are not valid (e.g. min_priority above max_priority)."""
    values: dict[str, Any] = {}
    sources: dict[str, Source] = {}
    layers: list[tuple[Source, Doc]] = [("derived", derived), ("pool", pool), ("model", model)]
    for source, doc in layers:
        for name, value in doc.items():
            values[name], sources[name] = value, source
    try:
        policy = Policy.model_validate(values)
    except ValidationError as exc:
        raise _explain(exc, where) from None
    return Effective(policy, version, sources)
