"""The subset of JSON Schema that llmq's structured output honours.

The API checks a request's schema against it before queueing (400
``unsupported_parameter`` naming the first feature outside it), and the mock's
generator produces documents only for schemas that pass: one definition, so the
two cannot drift apart. :func:`unsupported` names the first problem.

The subset covers what Pydantic v2, zod (zod-to-json-schema) and OpenAI's
strict-mode docs write: ``anyOf``/``oneOf`` (``oneOf`` when its branches cannot
overlap: a distinct ``const``/``enum`` property, as a discriminated union has, or
distinct types), local ``$ref`` (recursion included, when a finite document
exists), ``allOf`` of objects, ``enum``/``const``, ``prefixItems``, ``format``,
``pattern`` (when a matching string can be generated), ``additionalProperties``
as a schema, ``uniqueItems``, number bounds and ``multipleOf``. What stays
refused is named in ``docs/clients.md``.
"""

from __future__ import annotations

import json
from typing import Any

from llmq.model.json_refs import (
    ANNOTATIONS,
    Refs,
    SchemaError,
    branches,
    constraining,
    kinds_of,
)
from llmq.model.json_values import compiled, number_value, string_value

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
        "prefixItems",
        "minItems",
        "maxItems",
        "uniqueItems",
        "minLength",
        "maxLength",
        "pattern",
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "anyOf",
        "oneOf",
        "allOf",
        "$ref",
    }
)
TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
MAX_DEPTH = 16
#: Characters of a generated document beyond which only what the schema requires
#: is added; a schema whose smallest document is larger is refused.
BUDGET = 20_000
#: A size that stands for "more than the budget" (or no finite document at all).
TOO_BIG = BUDGET + 1
_BOUNDS = (
    ("minItems", "maxItems"),
    ("minLength", "maxLength"),
    ("minimum", "maximum"),
    ("exclusiveMinimum", "exclusiveMaximum"),
)


def unsupported(schema: Any, path: str = "schema") -> str | None:
    """Why the mock cannot honour ``schema`` (a message naming where), or None."""
    checker = _Checker(schema)
    try:
        why = checker.problem(schema, path, 0)
        if why is None and Sizes(schema).of(schema) > BUDGET:
            return (
                f"{path}: the smallest document it allows exceeds {BUDGET} characters "
                "(or no finite document satisfies it)"
            )
    except RecursionError:
        return f"{path}: references nest too deeply"
    return why


class _Checker:
    """Walks every node reachable from the root once (references included)."""

    def __init__(self, root: Any) -> None:
        self.refs = Refs(root)
        self._seen: list[Any] = []  # nodes checked (kept alive, so their ids stay theirs)
        self._ids: set[int] = set()

    def problem(self, node: Any, path: str, depth: int) -> str | None:
        if node is True or id(node) in self._ids:
            return None
        self._seen.append(node)
        self._ids.add(id(node))
        if not isinstance(node, dict):
            return f"{path} must be an object"
        if depth > MAX_DEPTH:
            return f"{path} nests deeper than {MAX_DEPTH} levels"
        for key in node:
            if key not in KEYWORDS and key not in ANNOTATIONS:
                return f"{path}: the keyword '{key}' is not supported"
        try:
            effective = self.refs.effective(node)
        except SchemaError as exc:
            return f"{path}: {exc}"
        why = _keywords(effective, path) or _bounds(effective, path)
        why = why or _combinators(self.refs, effective, path) or _leaves(effective, path)
        if why:
            return why
        for child, where, level in self._children(node, effective, path, depth + 1):
            if (why := self.problem(child, where, level)) is not None:
                return why
        return None

    def _children(
        self, node: dict[str, Any], effective: dict[str, Any], path: str, depth: int
    ) -> list[tuple[Any, str, int]]:
        """Each subschema with where it is and its depth (a referenced definition is
        checked from depth 0: each reference is followed once)."""
        found: list[tuple[Any, str, int]] = []
        if "$ref" in node:
            found.append((self.refs.target(node["$ref"]), node["$ref"], 0))
        for source in (node, effective) if effective is not node else (node,):
            for name, sub in source.get("properties", {}).items():
                found.append((sub, f"{path}.properties.{name}", depth))
            items = source.get("items")
            for i, sub in enumerate(items if isinstance(items, list) else []):
                found.append((sub, f"{path}.items[{i}]", depth))
            if isinstance(items, dict):
                found.append((items, f"{path}.items", depth))
            for i, sub in enumerate(source.get("prefixItems", [])):
                found.append((sub, f"{path}.prefixItems[{i}]", depth))
            if isinstance(source.get("additionalProperties"), dict):
                found.append(
                    (source["additionalProperties"], f"{path}.additionalProperties", depth)
                )
            for key in ("anyOf", "oneOf", "allOf"):
                for i, sub in enumerate(source.get(key, [])):
                    found.append((sub, f"{path}.{key}[{i}]", depth))
        return found


def _keywords(schema: dict[str, Any], path: str) -> str | None:
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
    if any(props[r] is False for r in required):
        return f"{path}.required names a property whose schema is false"
    extra = schema.get("additionalProperties", True)
    if not isinstance(extra, bool | dict):
        return f"{path}.additionalProperties must be a boolean or a schema"
    items = schema.get("items", {})
    if not isinstance(items, bool | dict | list) or not isinstance(
        schema.get("prefixItems", []), list
    ):
        return f"{path}: items must be a schema and prefixItems a list"
    return None


def _bounds(schema: dict[str, Any], path: str) -> str | None:
    for low, high in _BOUNDS:
        lo, hi = schema.get(low), schema.get(high)
        for bound in (lo, hi):
            if bound is not None and (
                isinstance(bound, bool) or not isinstance(bound, int | float)
            ):
                return f"{path}: {low}/{high} must be numbers"
        if lo is not None and hi is not None and lo > hi:
            return f"{path}: {low} is above {high}"
    step = schema.get("multipleOf")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int | float)):
        return f"{path}: multipleOf must be a number"
    if step is not None and step <= 0:
        return f"{path}: multipleOf must be above 0"
    return None


def _combinators(refs: Refs, schema: dict[str, Any], path: str) -> str | None:
    if "anyOf" in schema and "oneOf" in schema:
        return f"{path}: anyOf together with oneOf is not supported"
    for key in ("anyOf", "oneOf"):
        if key in schema and (not isinstance(schema[key], list) or not schema[key]):
            return f"{path}: {key} must be a non-empty list"
    if "oneOf" in schema:
        try:
            alternatives = [refs.effective(b) for b in branches(refs, schema)]
        except SchemaError as exc:
            return f"{path}: {exc}"
        if not _exclusive(refs, alternatives):
            return (
                f"{path}: oneOf whose branches may overlap is not supported (give each "
                "branch a distinct const property or type, or use anyOf)"
            )
    return None


def _exclusive(refs: Refs, alternatives: list[dict[str, Any]]) -> bool:
    """Whether no document can satisfy two of ``alternatives``: each has its own
    ``const``/``enum`` values, or its own types, or a required property (the same
    in all, a discriminator) whose ``const``/``enum`` values are its own."""
    if _disjoint([_values(a) for a in alternatives]):
        return True
    types = [
        set(a["type"] if isinstance(a["type"], list) else [a["type"]])
        for a in alternatives
        if "type" in a
    ]
    if len(types) == len(alternatives):
        types = [t | {"number"} if "integer" in t else t for t in types]
        if all(not (a & b) for i, a in enumerate(types) for b in types[i + 1 :]):
            return True
    common = set.intersection(*(set(a.get("required", [])) for a in alternatives))
    for name in sorted(common):
        try:
            tags = [_values(refs.effective(a["properties"][name])) for a in alternatives]
        except SchemaError:
            continue
        if _disjoint(tags):
            return True
    return False


def _values(schema: dict[str, Any]) -> set[str] | None:
    if "const" in schema:
        return {json.dumps(schema["const"], sort_keys=True)}
    if isinstance(schema.get("enum"), list):
        return {json.dumps(v, sort_keys=True) for v in schema["enum"]}
    return None


def _disjoint(sets: list[set[str] | None]) -> bool:
    seen: set[str] = set()
    for values in sets:
        if values is None or seen & values:
            return False
        seen |= values
    return True


def _leaves(schema: dict[str, Any], path: str) -> str | None:
    if "enum" in schema or "const" in schema or "anyOf" in schema or "oneOf" in schema:
        return None
    kinds = kinds_of(schema)
    if "pattern" in schema:
        if "format" in schema:
            return f"{path}: pattern together with format is not supported"
        if not isinstance(schema["pattern"], str) or compiled(schema["pattern"]) is None:
            return f"{path}: pattern is not a regular expression Python can read"
    if "string" in kinds and string_value(schema, None) is None:
        what = "the pattern" if "pattern" in schema else f"the format {schema.get('format')!r}"
        return f"{path}: no string of the allowed length matching {what} could be generated"
    for kind in ("integer", "number"):
        if kind in kinds and number_value(schema, kind, None) is None:
            return f"{path}: no {kind} meets its bounds and multipleOf"
    if schema.get("uniqueItems") is True and "array" in kinds:
        return _distinct_items(schema, path)
    return None


def _distinct_items(schema: dict[str, Any], path: str) -> str | None:
    items = schema.get("items")
    values = _values(items) if isinstance(items, dict) else None
    if isinstance(items, dict) and items.get("type") == "boolean":
        values = {"true", "false"}
    if values is not None and len(values) < int(schema.get("minItems", 0)):
        return f"{path}: uniqueItems with minItems above the number of distinct items"
    return None


class Sizes:
    """About how many characters the smallest document valid for a node has.

    A reference counts one more than its target, whose size comes from a table
    computed once for every reference the check met: the least fixed point over
    those references (a recursive definition whose every path recurses has no
    finite document: :data:`TOO_BIG`). With the extra one per reference, the
    generator, which always takes a smallest choice once it stops spending, follows
    sizes that decrease with every reference it crosses, so it ends.
    """

    def __init__(self, root: Any) -> None:
        self.refs = Refs(root)
        names = [n for n in _references(root) if _resolves(self.refs, n)]
        self.table = dict.fromkeys(names, TOO_BIG)
        for _ in range(len(names) + 1):
            changed = False
            for name in names:
                size = self._of(self.refs.effective(self.refs.target(name)), 0)
                if size < self.table[name]:
                    self.table[name], changed = size, True
            if not changed:
                break

    def of(self, node: Any) -> int:
        return self._of(node, 0)

    def _of(self, node: Any, depth: int) -> int:
        if not isinstance(node, dict) or depth > 2 * MAX_DEPTH:
            return 4 if node is True else TOO_BIG
        if "$ref" in node and not constraining({k: v for k, v in node.items() if k != "$ref"}):
            return min(TOO_BIG, self.table.get(node["$ref"], TOO_BIG) + 1)
        schema = self.refs.effective(node)
        values = [schema["const"]] if "const" in schema else schema.get("enum")
        if values:
            return min(len(json.dumps(v)) for v in values)
        if "anyOf" in schema or "oneOf" in schema:
            return min(self._of(b, depth + 1) for b in branches(self.refs, schema))
        return min(self.of_kind(schema, kind, depth) for kind in kinds_of(schema))

    def of_kind(self, schema: dict[str, Any], kind: str, depth: int = 0) -> int:
        """The smallest document of ``schema`` read as ``kind``."""
        if kind == "object":
            props = schema.get("properties", {})
            total = 2 + sum(
                len(name) + 4 + self._of(props[name], depth + 1)
                for name in schema.get("required", [])
            )
            return min(total, TOO_BIG)
        if kind == "array":
            prefix = prefix_items(schema)
            rest = rest_items(schema)
            total = 2
            for i in range(int(schema.get("minItems", 0))):
                item = prefix[i] if i < len(prefix) else rest
                total += 2 + self._of(item, depth + 1)
                if total >= TOO_BIG:
                    break
            return min(total, TOO_BIG)
        if kind == "string":
            return 2 + max(2, int(schema.get("minLength", 0)))
        return 5


def prefix_items(schema: dict[str, Any]) -> list[Any]:
    """The schemas of an array's first items (``prefixItems``, or draft 7's ``items`` list)."""
    items = schema.get("items")
    return list(schema.get("prefixItems", items if isinstance(items, list) else []))


def rest_items(schema: dict[str, Any]) -> Any:
    """The schema of the items after the prefix (``True``: anything, ``False``: none)."""
    items = schema.get("items", True)
    return True if isinstance(items, list) else items


def _references(node: Any) -> list[str]:
    """Every ``$ref`` string in a document, in order, once."""
    found: dict[str, None] = {}
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, dict):
            if isinstance(current.get("$ref"), str):
                found[current["$ref"]] = None
            stack.extend(current.values())
        elif isinstance(current, list):
            stack.extend(current)
    return list(found)


def _resolves(refs: Refs, name: str) -> bool:
    try:
        refs.effective(refs.target(name))
    except SchemaError:
        return False
    return True
