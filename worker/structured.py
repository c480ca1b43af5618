"""Structured output of the mock: JSON that validates against a schema, tool
arguments, synthetic log-probabilities, all deterministic per seed.

The schemas it is given passed :func:`llmq.model.json_subset.unsupported`; this
module only generates.
"""

from __future__ import annotations

import json
import math
import random
import re
from typing import Any

from llmq.model.json_subset import BUDGET
from llmq.schema import TokenLogprob

WORDS = (
    "the quick brown fox jumps over a lazy dog while the queue keeps order and "
    "every token streams one at a time"
).split()


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
