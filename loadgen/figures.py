"""The run's figures, computed from its request measurements as ``vllm bench serve`` does.

* Throughputs divide by the benchmark duration (start of the measured run to the
  end of its last request): completed requests, output tokens, input+output
  tokens per second. Goodput counts only successful requests that meet every
  SLO given (a TPOT SLO is met by a one-token output, which has no TPOT).
* Latency statistics use successful requests only; ITL pools every gap of every
  request. Percentiles interpolate linearly (``numpy.percentile``'s default).
  A statistic over no values is None, never a misleading 0.
* Sender lag: the load generator is *lagged* when the p99 of
  ``lag_s`` exceeds ``lag_threshold_ms`` (default 10 ms). The threshold is
  absolute because what a late send distorts is the latency we report, and it
  sits well above the event loop's timer granularity (a millisecond or so). A
  relative threshold (5 % of the mean inter-arrival) would trip on timer noise
  alone at high rates and say nothing for a closed loop.

The summary is a flat dict: ``{metric}_ms_{stat}`` for metric in ttft, tpot, itl,
e2el, lag and stat in mean, median, std, max and ``p{q}`` for each requested
percentile (``p99``, ``p99_9``), plus the counters documented in
:func:`summarize`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from loadgen.measurements import FAILURE_KINDS, RequestMeasurement

METRICS = ("ttft", "tpot", "itl", "e2el")


def percentile(values: Sequence[float] | np.ndarray[Any, Any], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation, like numpy.percentile.

    The one percentile of the load generator and the benchmarks.
    """
    if len(values) == 0:
        raise ValueError("percentile of no values")
    return float(np.percentile(np.asarray(values, dtype=float), q))


def percentile_key(q: float) -> str:
    """``99`` -> ``"p99"``, ``99.9`` -> ``"p99_9"``: a key safe everywhere."""
    return "p" + f"{q:g}".replace(".", "_")


def describe(values_s: Sequence[float], percentiles: Iterable[float]) -> dict[str, float | None]:
    """Mean, median, std, max and percentiles, in milliseconds, of values in seconds."""
    keys = ["mean", "median", "std", "max", *(percentile_key(q) for q in percentiles)]
    if not values_s:
        return dict.fromkeys(keys, None)
    ms = np.asarray(values_s, dtype=float) * 1000.0
    out: dict[str, float | None] = {
        "mean": float(ms.mean()),
        "median": float(np.median(ms)),
        "std": float(ms.std()),
        "max": float(ms.max()),
    }
    for q in percentiles:
        out[percentile_key(q)] = percentile(ms, q)
    return out


def metric_values(measurements: Iterable[RequestMeasurement], metric: str) -> list[float]:
    """The values in seconds of one latency metric over the successful measurements."""
    ok = [r for r in measurements if r.ok]
    if metric == "ttft":
        return [r.ttft_s for r in ok if r.ttft_s is not None]
    if metric == "tpot":
        return [r.tpot_s for r in ok if r.tpot_s is not None]
    if metric == "itl":
        return [gap for r in ok for gap in r.itl_s]
    if metric == "e2el":
        return [r.e2e_s for r in ok if r.e2e_s is not None]
    raise ValueError(f"unknown metric {metric!r}")


def meets_slos(measurement: RequestMeasurement, slos_ms: dict[str, float]) -> bool:
    """Whether a request succeeded and met every SLO (milliseconds) in ``slos_ms``."""
    if not measurement.ok:
        return False
    for metric, limit_ms in slos_ms.items():
        if metric == "tpot":
            if measurement.tpot_s is not None and measurement.tpot_s * 1000.0 > limit_ms:
                return False
            continue
        value = measurement.ttft_s if metric == "ttft" else measurement.e2e_s
        if value is None or value * 1000.0 > limit_ms:
            return False
    return True


def peak_in_flight(measurements: Iterable[RequestMeasurement]) -> int:
    """The most requests in flight at once, from their send and end times."""
    events = sorted(
        [(r.sent_s, 1) for r in measurements] + [(r.end_s, -1) for r in measurements],
        key=lambda e: (e[0], e[1]),  # an end before a send at the same instant
    )
    peak = current = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak


def summarize(
    measurements: Sequence[RequestMeasurement],
    *,
    duration_s: float,
    percentiles: Sequence[float] = (50.0, 90.0, 99.0),
    slos_ms: dict[str, float] | None = None,
    lag_threshold_ms: float = 10.0,
) -> dict[str, Any]:
    """The run's figures as a flat dict (see the module docstring for the latency keys).

    Counters: ``requests``, ``completed``, ``failed``, ``failures`` (every kind,
    zeros included), ``duration_s``, ``total_input_tokens``,
    ``total_output_tokens``, ``request_throughput``, ``output_throughput``,
    ``total_token_throughput``, ``goodput`` (None without SLOs), ``good_requests``,
    ``peak_in_flight``, ``lagged``, ``lag_threshold_ms`` and ``by_priority``
    (priority as a string -> completed, failed, ttft/e2el median and p99).
    """
    ok = [r for r in measurements if r.ok]
    failures = {kind: 0 for kind in FAILURE_KINDS}
    for r in measurements:
        if r.failure is not None:
            failures[r.failure] += 1
    input_tokens = sum(r.prompt_tokens for r in ok)
    output_tokens = sum(r.output_tokens for r in ok)
    per_s = 1.0 / duration_s if duration_s > 0 else 0.0
    good = sum(meets_slos(r, slos_ms) for r in ok) if slos_ms else None
    out: dict[str, Any] = {
        "requests": len(measurements),
        "completed": len(ok),
        "failed": len(measurements) - len(ok),
        "failures": failures,
        "duration_s": duration_s,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": len(ok) * per_s,
        "output_throughput": output_tokens * per_s,
        "total_token_throughput": (input_tokens + output_tokens) * per_s,
        "good_requests": good,
        "goodput": good * per_s if good is not None else None,
        "slos_ms": dict(slos_ms or {}),
        "peak_in_flight": peak_in_flight(measurements),
    }
    for metric in METRICS:
        for stat, value in describe(metric_values(measurements, metric), percentiles).items():
            out[f"{metric}_ms_{stat}"] = value
    lag = describe([r.lag_s for r in measurements], [*percentiles, 99.0])
    for stat, value in lag.items():
        out[f"lag_ms_{stat}"] = value
    out["lag_threshold_ms"] = lag_threshold_ms
    out["lagged"] = bool(lag["p99"] is not None and lag["p99"] > lag_threshold_ms)
    out["by_priority"] = by_priority(measurements)
    return out


def by_priority(measurements: Sequence[RequestMeasurement]) -> dict[str, dict[str, Any]]:
    """Per-priority counts and TTFT/E2EL medians and p99s (priority None is ``"none"``)."""
    groups: dict[str, list[RequestMeasurement]] = {}
    for r in measurements:
        groups.setdefault("none" if r.priority is None else str(r.priority), []).append(r)
    out: dict[str, dict[str, Any]] = {}
    for key in sorted(groups, key=_priority_order):
        group = groups[key]
        ttft = describe(metric_values(group, "ttft"), [99.0])
        e2el = describe(metric_values(group, "e2el"), [99.0])
        out[key] = {
            "completed": sum(r.ok for r in group),
            "failed": sum(not r.ok for r in group),
            "ttft_ms_median": ttft["median"],
            "ttft_ms_p99": ttft["p99"],
            "e2el_ms_median": e2el["median"],
            "e2el_ms_p99": e2el["p99"],
        }
    return out


def _priority_order(key: str) -> tuple[int, int]:
    return (1, 0) if key == "none" else (0, int(key))
