"""Leaf values for a JSON Schema: strings (``format``, ``pattern``, lengths) and
numbers (bounds, ``multipleOf``), each drawn from a seeded random source.

A draw can miss (a pattern's string too long for ``maxLength``, a float multiple
that the validator's arithmetic rejects), so every draw is checked and retried;
after the request's own draws come a fixed list of fallback draws. The check
(:mod:`llmq.model.json_subset`) refuses a schema for which the fallback draws find
nothing, so the mock's generator always finds a value: one implementation, used by
both sides. Patterns go through ``rstr``'s regex-driven generator and are then
verified with :func:`re.search`, as a validator reads them.
"""

from __future__ import annotations

import datetime
import itertools
import math
import random
import re
import string
import uuid
from collections.abc import Callable, Iterator
from functools import lru_cache
from typing import Any, TypeVar

import rstr

WORDS = (
    "the quick brown fox jumps over a lazy dog while the queue keeps order and "
    "every token streams one at a time"
).split()

#: Draws from the request's own random source before the fallback draws.
TRIES = 16
#: The fixed draws tried after those; the check requires one of them to succeed.
FALLBACKS = 16
#: Most repeats a pattern's ``*``/``+`` generates (rstr's own limit is 100).
REPEATS = 8

T = TypeVar("T")


#: rstr builds its non-word alphabet from a set: sorted, the draws are the same in
#: every process (hash randomisation would change them).
_NONWORD = "".join(sorted(set(string.printable) - set(string.ascii_letters + string.digits + "_")))


class _Xeger(rstr.Rstr):
    """rstr's generator with shorter unbounded repeats (strings for ``[a-z]+`` fit
    the usual ``maxLength``) and a fixed order for negated classes, so that a seed
    draws the same string in every process."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__(rng, nonword=_NONWORD)

    def _handle_in(self, value: Any) -> Any:
        candidates = list(itertools.chain(*(self._handle_state(i) for i in value)))
        if candidates and candidates[0] is False:
            candidates = sorted(set(string.printable).difference(candidates[1:]))
        return self._random.choice(candidates)

    def _handle_repeat(self, start_range: int, end_range: int, value: str) -> str:
        return super()._handle_repeat(start_range, min(end_range, max(start_range, REPEATS)), value)


@lru_cache(maxsize=256)
def compiled(pattern: str) -> re.Pattern[str] | None:
    """The pattern compiled, or None if Python's ``re`` cannot read it."""
    try:
        return re.compile(pattern)
    except (re.error, RecursionError, OverflowError):
        return None


def _first(draw: Callable[[random.Random], T | None], rng: random.Random) -> T | None:
    for source in _sources(rng):
        value = draw(source)
        if value is not None:
            return value
    return None


def _sources(rng: random.Random | None) -> Iterator[random.Random]:
    if rng is not None:
        for _ in range(TRIES):
            yield rng
    for i in range(FALLBACKS):
        yield random.Random(f"fallback:{i}")


def string_value(schema: dict[str, Any], rng: random.Random | None) -> str | None:
    """A string valid for ``schema``'s string keywords (None: none found; with
    ``rng`` None only the fallback draws, as the check tries them)."""
    if rng is None:
        return next((v for r in _sources(None) if (v := _string(schema, r)) is not None), None)
    return _first(lambda r: _string(schema, r), rng)


def _string(schema: dict[str, Any], rng: random.Random) -> str | None:
    low, high = int(schema.get("minLength", 0)), schema.get("maxLength")
    if "pattern" in schema:
        regex = compiled(str(schema["pattern"]))
        if regex is None:
            return None
        try:
            text = _Xeger(rng).xeger(regex.pattern)
        except Exception:  # rstr cannot build every construct (a group reference)
            return None
        if regex.search(text) is None:
            return None
    elif "format" in schema and schema["format"] in FORMATS:
        text = FORMATS[schema["format"]](rng)
    else:
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4)))
        while len(text) < low:
            text += " " + rng.choice(WORDS)
        return text[: int(high)] if high is not None else text
    return text if len(text) >= low and (high is None or len(text) <= high) else None


def _date(rng: random.Random) -> str:
    day = datetime.date(2020, 1, 1) + datetime.timedelta(days=rng.randrange(3650))
    return day.isoformat()


def _time(rng: random.Random) -> str:
    return f"{rng.randrange(24):02d}:{rng.randrange(60):02d}:{rng.randrange(60):02d}Z"


def _word(rng: random.Random) -> str:
    return f"{rng.choice(WORDS)}{rng.randrange(100)}"


#: Strings for the formats the generator knows; another format is an annotation.
FORMATS: dict[str, Callable[[random.Random], str]] = {
    "date": _date,
    "time": _time,
    "date-time": lambda r: f"{_date(r)}T{_time(r)}",
    "duration": lambda r: f"P{r.randrange(1, 30)}DT{r.randrange(24)}H",
    "email": lambda r: f"{_word(r)}@example.com",
    "hostname": lambda r: f"{_word(r)}.example.com",
    "uri": lambda r: f"https://example.com/{_word(r)}",
    "uri-reference": lambda r: f"/{_word(r)}",
    "url": lambda r: f"https://example.com/{_word(r)}",
    "uuid": lambda r: str(uuid.UUID(int=r.getrandbits(128), version=4)),
    "ipv4": lambda r: f"198.18.{r.randrange(256)}.{r.randrange(1, 255)}",
    "ipv6": lambda r: f"2001:db8::{r.randrange(1, 0xFFFF):x}",
}


def number_value(
    schema: dict[str, Any], kind: str, rng: random.Random | None
) -> int | float | None:
    """A number (``kind`` "integer" or "number") within ``schema``'s bounds and
    ``multipleOf``; None if none was found (``rng`` None: as the check tries)."""
    if rng is None:
        return next(
            (v for r in _sources(None) if (v := _number(schema, kind, r)) is not None), None
        )
    return _first(lambda r: _number(schema, kind, r), rng)


def _range(schema: dict[str, Any]) -> tuple[float, float]:
    lows = [schema[k] for k in ("minimum", "exclusiveMinimum") if k in schema]
    highs = [schema[k] for k in ("maximum", "exclusiveMaximum") if k in schema]
    low = max(lows) if lows else (min(highs) - 100 if highs else 0)
    high = min(highs) if highs else low + 100
    return low, high


def _integer_range(schema: dict[str, Any], low: float, high: float) -> tuple[int, int]:
    firsts = [math.ceil(schema["minimum"])] if "minimum" in schema else []
    lasts = [math.floor(schema["maximum"])] if "maximum" in schema else []
    if "exclusiveMinimum" in schema:
        firsts.append(math.floor(schema["exclusiveMinimum"]) + 1)
    if "exclusiveMaximum" in schema:
        lasts.append(math.ceil(schema["exclusiveMaximum"]) - 1)
    return max(firsts or [math.ceil(low)]), min(lasts or [math.floor(high)])


def _number(schema: dict[str, Any], kind: str, rng: random.Random) -> int | float | None:
    low, high = _range(schema)
    step = schema.get("multipleOf")
    value: int | float
    if step:
        first, last = math.ceil(low / step), math.floor(high / step)
        if first > last:
            return None
        value = rng.randint(first, last) * step
        if isinstance(value, float) and value.is_integer():
            value = int(value)
    elif kind == "integer":
        first, last = _integer_range(schema, low, high)
        if first > last:
            return None
        value = rng.randint(first, last)
    else:
        value = round(rng.uniform(low, high), 3)
    return value if fits_number(schema, kind, value) else None


_NUMBER_CHECKS: dict[str, Callable[[float, float], bool]] = {
    "minimum": lambda v, b: v >= b,
    "maximum": lambda v, b: v <= b,
    "exclusiveMinimum": lambda v, b: v > b,
    "exclusiveMaximum": lambda v, b: v < b,
}


def fits_number(schema: dict[str, Any], kind: str, value: int | float) -> bool:
    """Whether ``value`` meets ``schema``'s number keywords, with a validator's
    arithmetic (``multipleOf`` of a float: the quotient must be integral)."""
    if kind == "integer" and not float(value).is_integer():
        return False
    for key, holds in _NUMBER_CHECKS.items():
        if key in schema and not holds(value, schema[key]):
            return False
    step = schema.get("multipleOf")
    if not step:
        return True
    if isinstance(step, float):
        quotient = value / step
        return math.isfinite(quotient) and int(quotient) == quotient
    return not value % step
