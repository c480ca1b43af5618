"""The subset of JSON Schema that llmq's structured output honours.

The API checks a request's schema against it before queueing (400
``unsupported_parameter`` naming the first feature outside it), and the mock's
generator produces documents only for schemas that pass: one definition, so the
two cannot drift apart. :func:`unsupported` names the first problem.
"""

from __future__ import annotations

import math
from typing import Any

#: Keywords the generator honours; annotations that constrain nothing are allowed too.
KEYWORDS = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "enum",
        "const",
        "items",
        "minItems",
        "maxItems",
        "minLength",
        "maxLength",
        "minimum",
        "maximum",
    }
)
ANNOTATIONS = frozenset(
    {"title", "description", "default", "examples", "$schema", "$id", "$comment", "strict"}
)
TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
MAX_DEPTH = 16
#: Characters of a generated document beyond which only what the schema requires
#: is added; a schema whose smallest document is larger is refused.
BUDGET = 20_000


def unsupported(schema: Any, path: str = "schema") -> str | None:
    """Why the mock cannot honour ``schema`` (a message naming where), or None."""
    why = _problem(schema, path, 0)
    if why is None and smallest(schema) > BUDGET:
        return f"{path}: the smallest document it allows exceeds {BUDGET} characters"
    return why


def _problem(schema: Any, path: str, depth: int) -> str | None:
    if not isinstance(schema, dict):
        return f"{path} must be an object"
    if depth > MAX_DEPTH:
        return f"{path} nests deeper than {MAX_DEPTH} levels"
    why = _keywords(schema, path) or _bounds(schema, path)
    if why:
        return why
    for name, sub in schema.get("properties", {}).items():
        if (why := _problem(sub, f"{path}.properties.{name}", depth + 1)) is not None:
            return why
    if "items" in schema:
        return _problem(schema["items"], f"{path}.items", depth + 1)
    return None


def _keywords(schema: dict[str, Any], path: str) -> str | None:
    for key in schema:
        if key not in KEYWORDS and key not in ANNOTATIONS:
            return f"{path}: the keyword '{key}' is not supported"
    kinds = schema.get("type", [])
    for kind in kinds if isinstance(kinds, list) else [kinds]:
        if kind not in TYPES:
            return f"{path}: unknown type {kind!r}"
    if "enum" in schema and (not isinstance(schema["enum"], list) or not schema["enum"]):
        return f"{path}: enum must be a non-empty list"
    props = schema.get("properties", {})
    if not isinstance(props, dict):
        return f"{path}.properties must be an object"
    required = schema.get("required", [])
    if not isinstance(required, list) or any(r not in props for r in required):
        return f"{path}.required must list properties that the schema defines"
    return None


def _bounds(schema: dict[str, Any], path: str) -> str | None:
    kinds = schema.get("type", [])
    if kinds == "integer" or kinds == ["integer"]:
        lo, hi = schema.get("minimum"), schema.get("maximum")
        if isinstance(lo, int | float) and isinstance(hi, int | float) and math.ceil(lo) > hi:
            return f"{path}: no integer lies between minimum and maximum"
    for low, high in (("minItems", "maxItems"), ("minLength", "maxLength"), ("minimum", "maximum")):
        lo, hi = schema.get(low), schema.get(high)
        for bound in (lo, hi):
            if bound is not None and (
                isinstance(bound, bool) or not isinstance(bound, int | float)
            ):
                return f"{path}: {low}/{high} must be numbers"
        if lo is not None and hi is not None and lo > hi:
            return f"{path}: {low} is above {high}"
    return None


def smallest(schema: dict[str, Any], depth: int = 0) -> int:
    """About how many characters the smallest document valid for ``schema`` has
    (a type list counts its largest member, to stay on the safe side)."""
    if depth > MAX_DEPTH:
        return BUDGET + 1
    if "const" in schema or "enum" in schema:
        return 4
    kinds = schema.get("type")
    if kinds is None:
        kinds = ["object" if "properties" in schema else "array" if "items" in schema else "any"]
    elif not isinstance(kinds, list):
        kinds = [kinds]
    sizes = [4 + int(schema.get("minLength", 0))]
    if "object" in kinds:
        props = schema.get("properties", {})
        sizes.append(
            2
            + sum(
                len(name) + 4 + smallest(props[name], depth + 1)
                for name in schema.get("required", [])
                if isinstance(props.get(name), dict)
            )
        )
    if "array" in kinds:
        items = schema.get("items", {})
        each = smallest(items if isinstance(items, dict) else {}, depth + 1)
        sizes.append(2 + int(schema.get("minItems", 0)) * (2 + each))
    return max(sizes)
