"""Structured output of the mock: JSON that validates against a schema, tool
arguments, synthetic log-probabilities, all deterministic per seed.

The schemas it is given passed :func:`llmq.model.json_subset.unsupported`; this
module only generates.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any, TypeVar

from llmq.model.json_refs import Refs, branches, kinds_of
from llmq.model.json_subset import BUDGET, Sizes, prefix_items, rest_items, unsupported
from llmq.model.json_values import WORDS, number_value, string_value
from llmq.schema import TokenLogprob

#: References crossed (nested) before the generator takes only smallest choices, so
#: that a recursive schema (a tree of nodes) stays a few levels deep.
REF_DEPTH = 3
#: Draws for a distinct item of a ``uniqueItems`` array.
DISTINCT_TRIES = 8


def value_for(schema: dict[str, Any], rng: random.Random) -> Any:
    """A value that validates against ``schema`` (already checked by :func:`unsupported`)."""
    return _Generator(schema, rng).value(schema)


class _Generator:
    """Draws values. While it spends (under :data:`BUDGET` characters, fewer than
    :data:`REF_DEPTH` references deep) it draws freely among the choices that fit
    the budget; past that it takes only smallest choices (required properties,
    ``minItems``, the smallest branch and type), whose sizes
    (:class:`~llmq.model.json_subset.Sizes`) shrink with every reference crossed,
    so that the output stays bounded and a recursive schema ends."""

    def __init__(self, schema: dict[str, Any], rng: random.Random) -> None:
        self.rng = rng
        self.spent = 0
        self.refs = Refs(schema)
        self.sizes = Sizes(schema)
        self.depth = 0

    @property
    def lavish(self) -> bool:
        return self.spent < BUDGET and self.depth < REF_DEPTH

    def value(self, node: Any) -> Any:
        if isinstance(node, dict) and "$ref" in node:
            self.depth += 1
            try:
                return self._value(self.refs.effective(node))
            finally:
                self.depth -= 1
        return self._value(self.refs.effective(node))

    def _value(self, schema: dict[str, Any]) -> Any:
        rng = self.rng
        self.spent += 4
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            if self.lavish:
                return rng.choice(schema["enum"])
            return min(schema["enum"], key=lambda v: len(json.dumps(v)))
        if "anyOf" in schema or "oneOf" in schema:
            options = branches(self.refs, schema)
            return self.value(self._choose(options, [self.sizes.of(b) for b in options]))
        kinds = kinds_of(schema)
        kind = self._choose(kinds, [self.sizes.of_kind(schema, k) for k in kinds])
        if kind == "object":
            return self._object(schema)
        if kind == "array":
            return self._array(schema)
        if kind in ("integer", "number"):
            return _found(number_value(schema, kind, rng), schema)
        if kind == "boolean":
            return rng.random() < 0.5
        if kind == "null":
            return None
        text = _found(string_value(schema, rng), schema)
        self.spent += len(text)
        return text

    def _choose(self, options: list[T], sizes: list[int]) -> T:
        """A random option among those the budget affords; the smallest when frugal."""
        smallest = min(range(len(options)), key=sizes.__getitem__)
        if not self.lavish:
            return options[smallest]
        left = BUDGET - self.spent
        fitting = [o for o, size in zip(options, sizes, strict=True) if size <= left]
        return self.rng.choice(fitting) if fitting else options[smallest]

    def _object(self, schema: dict[str, Any]) -> dict[str, Any]:
        rng = self.rng
        props: dict[str, Any] = schema.get("properties", {})
        required = set(schema.get("required", []))
        out = {
            name: self.value(sub)
            for name, sub in props.items()
            if name in required or (sub is not False and self.lavish and rng.random() < 0.5)
        }
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict) and self.lavish and self.sizes.of(extra) < BUDGET - self.spent:
            for _ in range(rng.randint(0, 2)):
                name = f"{rng.choice(WORDS)}_{rng.randrange(100)}"
                if name not in props:
                    out[name] = self.value(extra)
        return out

    def _array(self, schema: dict[str, Any]) -> list[Any]:
        prefix, rest = prefix_items(schema), rest_items(schema)
        low = int(schema.get("minItems", 0))
        high = int(schema.get("maxItems", max(low, len(prefix)) + 3))
        if rest is False:
            high = min(high, max(low, len(prefix)))
        if not self.lavish:
            count = low
        elif prefix:
            count = max(low, min(len(prefix), high))
        else:
            count = self.rng.randint(min(max(low, 1), high), min(high, low + 3))
        unique = schema.get("uniqueItems") is True
        out: list[Any] = []
        seen: set[str] = set()
        for i in range(count):
            item = prefix[i] if i < len(prefix) else rest
            for _ in range(DISTINCT_TRIES if unique else 1):
                value = self.value(item)
                key = json.dumps(value, sort_keys=True)
                if key not in seen:
                    break
            else:
                if i >= low:
                    break  # enough distinct items already
                raise ValueError("no distinct items could be drawn for uniqueItems")
            seen.add(key)
            out.append(value)
        return out


T = TypeVar("T")


def _found(value: V | None, schema: dict[str, Any]) -> V:
    """A leaf value the check guaranteed (its fallback draws found one)."""
    if value is None:
        raise ValueError(f"no value could be drawn for {schema!r}: {unsupported(schema)}")
    return value


V = TypeVar("V", str, int, float)


def object_text(schema: dict[str, Any] | None, rng: random.Random, limit: int = 0) -> str:
    """A JSON document for ``schema``; without one, a small object (JSON mode).

    With ``limit`` (the request's tokens): a document longer than that many
    :func:`pieces` is drawn again with only what the schema requires, as a model
    asked for a short answer would write it, so that a client's default
    ``max_tokens`` mostly holds a whole document.
    """
    if schema is None:
        schema = {"type": "object", "properties": {"answer": {"type": "string"}}}
        schema["required"] = ["answer"]
    text = json.dumps(value_for(schema, rng))
    if limit and len(pieces(text)) > limit:
        generator = _Generator(schema, rng)
        generator.spent = BUDGET  # from the start, only what the schema requires
        text = json.dumps(generator.value(schema))
    return text


#: Most places in a prompt where :func:`schema_in_prompt` tries to read JSON.
PROMPT_SCAN = 256
_SCHEMA_MARKS = ("properties", "$ref", "$defs", "anyOf", "oneOf", "allOf")


def schema_in_prompt(prompt: str) -> dict[str, Any] | None:
    """The last JSON Schema of an object written in ``prompt`` that the mock can
    honour, or None.

    JSON mode promises only an object; a model follows the format the prompt asks
    for, and clients in JSON mode (instructor, LangChain's format instructions) put
    the model's JSON Schema in the prompt. The last one wins: LangChain's
    instructions show an example schema before the real one.
    """
    decoder = json.JSONDecoder()
    found = None
    position = prompt.find("{")
    for _ in range(PROMPT_SCAN):
        if position < 0:
            break
        try:
            value, end = decoder.raw_decode(prompt, position)
        except ValueError:
            position = prompt.find("{", position + 1)
            continue
        if (
            isinstance(value, dict)
            and any(mark in value for mark in _SCHEMA_MARKS)
            and unsupported(value) is None
            and "object" in kinds_of(Refs(value).effective(value))
        ):
            found = value
        position = prompt.find("{", end)
    return found


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
