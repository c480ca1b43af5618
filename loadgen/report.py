"""The human summary (in ``vllm bench serve``'s layout) and the JSON results file.

The table keeps vLLM's labels and 50-column rules so results can be compared side
by side with vLLM's, then adds what vLLM does not print: failures by kind, the
per-priority TTFT, and the sender lag with a warning when the generator fell
behind its schedule (such a run under-reports the offered load).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from loadgen.figures import percentile_key
from loadgen.result import RunResult

WIDTH = 50
SECTIONS = (
    ("ttft", "TTFT", "Time to First Token"),
    ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
    ("itl", "ITL", "Inter-token Latency"),
    ("e2el", "E2EL", "End-to-end Latency"),
)


def _row(label: str, value: object, fmt: str = "") -> str:
    if value is None:
        text = "n/a"
    elif isinstance(value, float) and fmt:
        text = format(value, fmt)
    else:
        text = str(value)
    return f"{label:<40} {text:<10}".rstrip()


def _rule(title: str, fill: str) -> str:
    return f"{title:{fill}^{WIDTH}}"


def lag_warning(summary: dict[str, Any]) -> str | None:
    """The warning line for a lagged run, else None."""
    if not summary.get("lagged"):
        return None
    return (
        f"WARNING: the load generator lagged: p99 send lag {summary['lag_ms_p99']:.1f} ms "
        f"> {summary['lag_threshold_ms']:g} ms; the offered load was lower than configured "
        "(use more loadgen processes or a lower rate)."
    )


def format_summary(result: RunResult) -> str:
    """The summary table as plain text (no trailing newline)."""
    s = result.summary()
    config = result.config
    lines = [_rule(" Serving Benchmark Result ", "=")]
    lines.append(_row("Target:", result.target))
    lines.append(_row("Successful requests:", s["completed"]))
    lines.append(_row("Failed requests:", s["failed"]))
    if config.slots is not None:
        label = "Closed-loop users:" if config.closed_loop else "Maximum request concurrency:"
        lines.append(_row(label, config.slots))
    if not config.closed_loop and not math.isinf(config.request_rate):
        lines.append(_row("Request rate configured (RPS):", config.request_rate, ".2f"))
    lines.append(_row("Benchmark duration (s):", s["duration_s"], ".2f"))
    lines.append(_row("Total input tokens:", s["total_input_tokens"]))
    lines.append(_row("Total generated tokens:", s["total_output_tokens"]))
    lines.append(_row("Request throughput (req/s):", s["request_throughput"], ".2f"))
    if s["goodput"] is not None:
        lines.append(_row("Request goodput (req/s):", s["goodput"], ".2f"))
    lines.append(_row("Output token throughput (tok/s):", s["output_throughput"], ".2f"))
    lines.append(_row("Peak concurrent requests:", s["peak_in_flight"]))
    lines.append(_row("Total Token throughput (tok/s):", s["total_token_throughput"], ".2f"))
    for key, short, title in SECTIONS:
        lines.append(_rule(title, "-"))
        lines.append(_row(f"Mean {short} (ms):", s[f"{key}_ms_mean"], ".2f"))
        lines.append(_row(f"Median {short} (ms):", s[f"{key}_ms_median"], ".2f"))
        for q in (q for q in config.percentiles if q != 50):  # P50 is the median
            value = s[f"{key}_ms_{percentile_key(q)}"]
            lines.append(_row(f"P{q:g} {short} (ms):", value, ".2f"))
    if s["failed"]:
        lines.append(_rule("Failures", "-"))
        for kind, count in s["failures"].items():
            if count:
                lines.append(_row(f"{kind}:", count))
    if len(s["by_priority"]) > 1:
        lines.append(_rule("TTFT by Priority", "-"))
        for priority, fig in s["by_priority"].items():
            lines.append(_row(f"Priority {priority} median / P99 (ms):", _pair(fig)))
    lines.append(_rule("Sender Lag", "-"))
    lines.append(_row("P99 send lag (ms):", s["lag_ms_p99"], ".2f"))
    lines.append(_row("Max send lag (ms):", s["lag_ms_max"], ".2f"))
    lines.append("=" * WIDTH)
    warning = lag_warning(s)
    if warning:
        lines.append(warning)
    return "\n".join(lines)


def _pair(fig: dict[str, Any]) -> str:
    median, p99 = fig["ttft_ms_median"], fig["ttft_ms_p99"]
    if median is None or p99 is None:
        return "n/a"
    return f"{median:.2f} / {p99:.2f}"


def write_json(result: RunResult, path: str | Path) -> Path:
    """Write settings, figures and every measurement to ``path`` (parents created)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result.to_json(), indent=2, allow_nan=False) + "\n")
    return out
