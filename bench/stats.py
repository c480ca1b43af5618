"""Combining repeated runs: medians over repeats and side-by-side ratios.

One run on a shared machine can be hit by a neighbour's burst, so every figure
is the median over ``--repeats`` runs. Comparisons are made pair by pair (run i
of A against run i of B, which ran next to each other) and the median of those
ratios is reported: a slow patch of the machine then moves both sides of a
ratio instead of only one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from loadgen.figures import percentile


def _numbers(values: Iterable[Any]) -> list[float]:
    return [
        float(v)
        for v in values
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    ]


def median(values: Iterable[Any]) -> float | None:
    """Median of the finite numbers in ``values``; None if there are none."""
    numbers = _numbers(values)
    return float(np.median(numbers)) if numbers else None


def describe_ms(values_ms: Iterable[Any]) -> dict[str, float | None]:
    """count, median, p90, p99, max of values already in milliseconds."""
    numbers = _numbers(values_ms)
    return {
        "count": float(len(numbers)),
        "median": median(numbers),
        "p90": percentile(numbers, 90) if numbers else None,
        "p99": percentile(numbers, 99) if numbers else None,
        "max": max(numbers) if numbers else None,
    }


def median_of(runs: Sequence[Mapping[str, Any]], key: str) -> float | None:
    """Median over runs of one figure."""
    return median(run.get(key) for run in runs)


def medians(runs: Sequence[Mapping[str, Any]], keys: Iterable[str]) -> dict[str, float | None]:
    return {key: median_of(runs, key) for key in keys}


def ratio(a: Any, b: Any) -> float | None:
    if not isinstance(a, int | float) or not isinstance(b, int | float) or b == 0:
        return None
    return float(a) / float(b)


def paired_differences(
    a_runs: Sequence[Mapping[str, Any]], b_runs: Sequence[Mapping[str, Any]], key: str
) -> float | None:
    """Median over pairs of runs made side by side of ``key``'s a - b."""
    each = [
        float(a[key]) - float(b[key])
        for a, b in zip(a_runs, b_runs, strict=False)
        if isinstance(a.get(key), int | float) and isinstance(b.get(key), int | float)
    ]
    return median(each)


def paired_ratios(
    a_runs: Sequence[Mapping[str, Any]], b_runs: Sequence[Mapping[str, Any]], key: str
) -> dict[str, Any]:
    """Ratio a/b of ``key`` for each pair of runs made side by side, and their median."""
    each = [ratio(a.get(key), b.get(key)) for a, b in zip(a_runs, b_runs, strict=False)]
    return {"each": each, "median": median(each)}
