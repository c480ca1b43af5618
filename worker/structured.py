"""Structured output of the mock: JSON that validates against a schema, tool
arguments, synthetic log-probabilities, all deterministic per seed.

The mock honours a subset of JSON Schema (:data:`KEYWORDS`); :func:`unsupported`
names the first feature outside it, so that the API answers 400
``unsupported_parameter`` instead of returning JSON the schema would reject.
"""

from __future__ import annotations

import json
import math
import random
import re
from typing import Any

from llmq.schema import TokenLogprob

WORDS = (
    "the quick brown fox jumps over a lazy dog while the queue keeps order and "
    "every token streams one at a time"
).split()

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


def value_for(schema: dict[str, Any], rng: random.Random) -> Any:
    """A value that validates against ``schema`` (already checked by :func:`unsupported`)."""
    return _Generator(rng).value(schema)


class _Generator:
    """Draws values; past :data:`BUDGET` characters it adds only what the schema
    requires (required properties, ``minItems``), so that the output stays bounded."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.spent = 0

    @property
    def lavish(self) -> bool:
        return self.spent < BUDGET

    def value(self, schema: dict[str, Any]) -> Any:
        rng = self.rng
        self.spent += 4
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            return rng.choice(schema["enum"])
        kind = _kind(schema, rng)
        if kind == "object":
            props: dict[str, Any] = schema.get("properties", {})
            required = set(schema.get("required", []))
            return {
                name: self.value(sub)
                for name, sub in props.items()
                if name in required or (self.lavish and rng.random() < 0.5)
            }
        if kind == "array":
            low = int(schema.get("minItems", 0))
            high = min(int(schema.get("maxItems", low + 3)), low + 3)
            count = rng.randint(min(max(low, 1), high), high) if self.lavish else low
            return [self.value(schema.get("items", {})) for _ in range(count)]
        if kind in ("integer", "number"):
            return _number(schema, kind, rng)
        if kind == "boolean":
            return rng.random() < 0.5
        if kind == "null":
            return None
        text = _string(schema, rng)
        self.spent += len(text)
        return text


def _kind(schema: dict[str, Any], rng: random.Random) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = rng.choice(kind) if kind else None
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    return str(kind)


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


def _number(schema: dict[str, Any], kind: str, rng: random.Random) -> int | float:
    low = schema.get("minimum", 0 if "maximum" not in schema else schema["maximum"] - 100)
    high = schema.get("maximum", low + 100)
    if kind == "integer":
        return rng.randint(math.ceil(low), math.floor(high)) if math.ceil(low) <= high else 0
    return round(rng.uniform(low, high), 3) if high > low else low


def _string(schema: dict[str, Any], rng: random.Random) -> str:
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4)))
    low, high = int(schema.get("minLength", 0)), schema.get("maxLength")
    while len(text) < low:
        text += " " + rng.choice(WORDS)
    return text[: int(high)] if high is not None else text


def object_text(schema: dict[str, Any] | None, rng: random.Random) -> str:
    """A JSON document for ``schema``; without one, a small object (JSON mode)."""
    if schema is None:
        schema = {"type": "object", "properties": {"answer": {"type": "string"}}}
        schema["required"] = ["answer"]
    return json.dumps(value_for(schema, rng))


_PIECES = re.compile(r"[A-Za-z0-9_]+|\s+|[^A-Za-z0-9_\s]")


def pieces(text: str) -> list[str]:
    """``text`` cut into token-sized pieces whose concatenation is ``text``."""
    return _PIECES.findall(text)


def logprob_of(seed: int, index: int, token: str, top: int) -> TokenLogprob:
    """A synthetic log-probability of ``token`` at ``index``, with ``top`` alternatives
    (the token first), the same for the same seed and position."""
    rng = random.Random(f"{seed}:{index}")
    logprob = -round(rng.expovariate(4.0), 4)
    alternatives: list[tuple[str, float]] = [(token, logprob)] if top else []
    others = [w for w in WORDS if " " + w != token and w != token]
    current = logprob
    for word in rng.sample(others, min(max(top - 1, 0), len(others))):
        current = round(current - rng.uniform(0.1, 1.5), 4)
        alternatives.append((" " + word, current))
    return TokenLogprob(logprob=logprob, top=alternatives)
