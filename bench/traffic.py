"""Driving traffic through :mod:`loadgen` and extracting the figures the scenarios need.

Every streaming scenario uses :func:`loadgen.run_load`, the same client and the
same definitions of TTFT/ITL/E2E as ``llmq loadgen``, so a figure here can be
reproduced from the command line. Each run gets a fresh event loop
(``asyncio.run``), the standard one as in the loadgen CLI, so nothing from one
run (connections, tasks, the in-process baseline) leaks into the next.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from loadgen import LoadConfig, RunResult, run_load


@dataclass(frozen=True)
class Requests:
    """What a scenario's requests look like and the mock model that serves them:
    fixed prompt and output lengths, the model's decode and prefill speeds. Each
    scenario's ``Sizes`` extends it (and may change its defaults)."""

    prompt_tokens: int = 100
    output_tokens: int = 32
    tokens_per_second: float = 50.0
    prefill_seconds_per_token: float = 0.0001

    def load(self, seed: int, *, timeout: float, **run: Any) -> LoadConfig:
        """The load of these requests; ``run``: the rest of the :class:`LoadConfig`
        (arrivals or concurrency, bounds, target)."""
        return LoadConfig(
            prompt_tokens=(self.prompt_tokens, self.prompt_tokens),
            output_tokens=(self.output_tokens, self.output_tokens),
            tokens_per_second=self.tokens_per_second,
            prefill_seconds_per_token=self.prefill_seconds_per_token,
            seed=seed,
            timeout=timeout,
            **run,
        )


#: Figures copied from ``RunResult.summary()`` into every run's record.
SUMMARY_KEYS = (
    "requests",
    "completed",
    "failed",
    "failures",
    "duration_s",
    "request_throughput",
    "output_throughput",
    "total_output_tokens",
    "peak_in_flight",
    "ttft_ms_median",
    "ttft_ms_p90",
    "ttft_ms_p99",
    "itl_ms_median",
    "itl_ms_p99",
    "tpot_ms_median",
    "e2el_ms_median",
    "e2el_ms_p99",
    "lag_ms_p99",
    "lagged",
)


def run(config: LoadConfig) -> RunResult:
    """One load run in a fresh event loop."""
    return asyncio.run(run_load(config))


def figures(result: RunResult) -> dict[str, Any]:
    """The summary keys the suite reports, plus the failure count by kind."""
    summary = result.summary()
    out = {key: summary.get(key) for key in SUMMARY_KEYS}
    out["failures"] = {k: v for k, v in (summary.get("failures") or {}).items() if v}
    return out


def rejected(result: RunResult, kind: str = "http_429") -> list[float]:
    """Latency (ms) of the answers that refused a request: send to end of the response."""
    return [
        (r.end_s - r.sent_s) * 1000.0 for r in result.measurements if r.failure == kind and r.end_s
    ]


def first_errors(result: RunResult, limit: int = 3) -> list[str]:
    """A few failure messages, to explain a failed level without reading every measurement."""
    seen: list[str] = []
    for measurement in result.measurements:
        if measurement.error and f"{measurement.failure}: {measurement.error}" not in seen:
            seen.append(f"{measurement.failure}: {measurement.error}"[:300])
        if len(seen) >= limit:
            break
    return seen


def steady_throughput(result: RunResult, start_s: float, end_s: float) -> dict[str, float]:
    """Completions and output tokens per second between two run-relative times.

    A closed loop starts with every user at once and ends with a tail of
    stragglers; counting only requests that finished inside a window past the
    ramp and before the last send measures the sustained rate.
    """
    span = end_s - start_s
    done = [r for r in result.measurements if r.ok and start_s <= r.end_s < end_s]
    tokens = sum(r.output_tokens for r in done)
    return {
        "window_s": span,
        "requests_per_s": len(done) / span if span > 0 else 0.0,
        "output_tokens_per_s": tokens / span if span > 0 else 0.0,
    }
