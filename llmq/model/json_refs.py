"""A schema's effective form: ``$ref`` followed, ``allOf`` merged into one schema.

Pydantic, zod and the OpenAI strict-mode docs write nested models as ``$ref`` to
``$defs``/``definitions`` (zod also to ``#/properties/...``), sometimes with
sibling keywords, and older Pydantic wraps a reference in a one-member ``allOf``.
The check (:mod:`llmq.model.json_subset`) and the mock's generator both read a
schema through :meth:`Refs.effective`, so they agree on what a node means.

``allOf`` is merged for what those tools produce: objects (properties, required,
``additionalProperties``), and any schema combined with annotations or with
compatible bounds. What cannot be merged raises :class:`SchemaError`, which the
check reports as unsupported.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

#: Keywords that constrain nothing; dropped when nodes merge.
ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$schema",
        "$id",
        "$comment",
        "$anchor",
        "strict",
        "readOnly",
        "writeOnly",
        "deprecated",
        "discriminator",
        "contentEncoding",
        "contentMediaType",
        "$defs",
        "definitions",
    }
)

#: Most ``$ref``/``allOf`` hops resolved for one node (a longer chain is a loop).
MAX_HOPS = 32

_LOWER = ("minimum", "exclusiveMinimum", "minItems", "minLength")
_UPPER = ("maximum", "exclusiveMaximum", "maxItems", "maxLength")


class SchemaError(ValueError):
    """A schema the subset cannot read (a bad reference, an unmergeable ``allOf``)."""


class Refs:
    """Reads the nodes of one root schema; every ``$ref`` is local to it."""

    def __init__(self, root: Any) -> None:
        self.root = root

    def target(self, ref: Any) -> Any:
        """The node a local reference (``#``, ``#/$defs/X``) points at."""
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise SchemaError(f"only local references ('#/...') are supported, not {ref!r}")
        node = self.root
        for raw in ref[1:].split("/")[1:] if ref != "#" else []:
            part = urllib.parse.unquote(raw).replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise SchemaError(f"the reference {ref!r} points at nothing")
        return node

    def effective(self, schema: Any, hops: int = 0) -> dict[str, Any]:
        """``schema`` with its reference followed and its ``allOf`` merged (one level:
        nested nodes keep theirs). ``True`` reads as ``{}``."""
        if hops > MAX_HOPS:
            raise SchemaError("references or allOf loop without reaching a schema")
        if schema is True:
            return {}
        if not isinstance(schema, dict):
            raise SchemaError("a schema must be an object")
        if "$ref" in schema:
            target = self.effective(self.target(schema["$ref"]), hops + 1)
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            if not constraining(rest):
                return target
            return self.effective({"allOf": [target, rest]}, hops + 1)
        if "allOf" in schema:
            members = schema["allOf"]
            if not isinstance(members, list) or not members:
                raise SchemaError("allOf must be a non-empty list")
            rest = {k: v for k, v in schema.items() if k != "allOf"}
            parts = [self.effective(m, hops + 1) for m in members]
            return merge([*parts, rest] if constraining(rest) else parts)
        return schema


def constraining(schema: dict[str, Any]) -> bool:
    """Whether ``schema`` has a keyword other than annotations."""
    return any(k not in ANNOTATIONS for k in schema)


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One schema that a document satisfies exactly when it satisfies every part
    (for the keywords merged here; anything else raises :class:`SchemaError`)."""
    parts = [p for p in parts if constraining(p)]
    if len(parts) == 1:
        return parts[0]
    merged: dict[str, Any] = {}
    closed: list[set[str]] = []  # the properties of each part that forbids others
    for part in parts:
        if part.get("additionalProperties") is False:
            closed.append(set(part.get("properties", {})))
        for key, value in part.items():
            if key not in ANNOTATIONS:
                _merge_key(merged, key, value)
    if closed:
        allowed = set.intersection(*closed)
        for name in merged.get("required", []):
            if name not in allowed:
                raise SchemaError(
                    f"allOf: the required property {name!r} is excluded by "
                    "additionalProperties: false of another member"
                )
        merged["properties"] = {
            k: v for k, v in merged.get("properties", {}).items() if k in allowed
        }
        merged["additionalProperties"] = False
    return merged


def _merge_key(merged: dict[str, Any], key: str, value: Any) -> None:
    if key not in merged:
        merged[key] = dict(value) if key == "properties" else value
    elif key == "properties":
        for name, sub in value.items():
            own = merged[key].get(name)
            merged[key][name] = sub if own is None else {"allOf": [own, sub]}
    elif key == "required":
        merged[key] = [*merged[key], *(r for r in value if r not in merged[key])]
    elif key == "type":
        merged[key] = _common_types(merged[key], value)
    elif key == "additionalProperties":
        if merged[key] is False or value is False:
            merged[key] = False
        elif value is not True:
            merged[key] = value if merged[key] is True else {"allOf": [merged[key], value]}
    elif key in _LOWER:
        merged[key] = max(merged[key], value)
    elif key in _UPPER:
        merged[key] = min(merged[key], value)
    elif merged[key] != value:
        raise SchemaError(f"allOf: members with different '{key}' cannot be combined")


def _common_types(a: Any, b: Any) -> list[str]:
    left = set(a if isinstance(a, list) else [a])
    right = set(b if isinstance(b, list) else [b])
    both = left & right
    if ("integer" in left and "number" in right) or ("number" in left and "integer" in right):
        both.add("integer")
    if not both:
        raise SchemaError("allOf: members allow no common type")
    return sorted(both)


def branches(refs: Refs, schema: dict[str, Any]) -> list[Any]:
    """The alternatives of an ``anyOf``/``oneOf`` node, each combined with the node's
    other keywords (a branch without those is returned as written, references
    unresolved)."""
    key = "anyOf" if "anyOf" in schema else "oneOf"
    rest = {k: v for k, v in schema.items() if k != key}
    if not constraining(rest):
        return list(schema[key])
    return [merge([refs.effective(b), rest]) for b in schema[key]]


def kinds_of(schema: dict[str, Any]) -> list[str]:
    """The types a node allows: its ``type``, else what its keywords imply (a node
    that implies nothing is generated as a string)."""
    kind = schema.get("type")
    if kind is not None:
        return list(kind) if isinstance(kind, list) else [kind]
    for implied, words in _IMPLIED:
        if any(w in schema for w in words):
            return [implied]
    return ["string"]


_IMPLIED = (
    ("object", ("properties", "required", "additionalProperties")),
    ("array", ("items", "prefixItems", "minItems", "maxItems", "uniqueItems")),
    ("string", ("pattern", "format", "minLength", "maxLength")),
    ("number", ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")),
)
