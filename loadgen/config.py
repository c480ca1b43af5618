"""The settings of one load run, and the parsers for their command-line spellings.

:class:`LoadConfig` is the single description of a run shared by the CLI and the
benchmark suite. It is validated on construction so that a contradictory run
(a closed loop with a request rate, an endless open loop) fails before any
request is sent rather than producing numbers that mean something else.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Endpoint = Literal["completions", "chat"]
SLO_METRICS = ("ttft", "tpot", "e2el")
DEFAULT_NUM_REQUESTS = 100
DEFAULT_LAG_THRESHOLD_MS = 10.0


@dataclass(frozen=True)
class LoadConfig:
    """What traffic to send, to which target, and how to judge it.

    Traffic is an *open loop* (arrivals on a schedule: ``request_rate``,
    ``burstiness``, ``ramp_up``, optionally capped by ``max_concurrency``) unless
    ``concurrency`` is set, which makes it a *closed loop* of that many users.
    The run stops after ``num_requests`` or ``duration`` seconds, whichever comes
    first; with neither, after :data:`DEFAULT_NUM_REQUESTS` requests.

    ``prompt_tokens`` and ``output_tokens`` are inclusive ``(low, high)`` ranges
    drawn uniformly; ``dataset`` replaces both with a JSONL file. ``goodput``
    maps ``ttft``/``tpot``/``e2el`` to an SLO in milliseconds. ``in_process``
    sends the same traffic to :mod:`loadgen.baseline` instead of ``base_url``,
    with the model timings ``tokens_per_second``/``prefill_seconds_per_token``
    and ``baseline_concurrency`` slots.
    """

    base_url: str = "http://127.0.0.1:8000"
    endpoint: Endpoint = "completions"
    model: str = "mock"
    api_key: str | None = None
    request_rate: float = math.inf
    burstiness: float = 1.0
    max_concurrency: int | None = None
    concurrency: int | None = None
    ramp_up: tuple[float, float] | None = None
    duration: float | None = None
    num_requests: int | None = None
    warmup: int = 0
    prompt_tokens: tuple[int, int] = (100, 100)
    output_tokens: tuple[int, int] = (100, 100)
    dataset: str | None = None
    priority_mix: tuple[tuple[int, float], ...] | None = None
    seed: int = 0
    goodput: dict[str, float] = field(default_factory=dict)
    percentiles: tuple[float, ...] = (50.0, 90.0, 99.0)
    timeout: float = 600.0
    in_process: bool = False
    tokens_per_second: float = 50.0
    prefill_seconds_per_token: float = 0.0001
    baseline_concurrency: int = 16
    lag_threshold_ms: float = DEFAULT_LAG_THRESHOLD_MS
    progress: bool = False

    def __post_init__(self) -> None:
        problems = _problems(self)
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def closed_loop(self) -> bool:
        return self.concurrency is not None

    @property
    def request_limit(self) -> int | None:
        """The number of measured requests, or None when only the duration bounds the run."""
        if self.num_requests is None and self.duration is None:
            return DEFAULT_NUM_REQUESTS
        return self.num_requests

    @property
    def slots(self) -> int | None:
        """The most requests in flight by design, or None when the open loop is uncapped."""
        return self.concurrency if self.concurrency is not None else self.max_concurrency

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe settings: infinities spelled ``"inf"``, the API key redacted."""
        data = {
            key: str(value) if isinstance(value, float) and not math.isfinite(value) else value
            for key, value in asdict(self).items()
        }
        data["num_requests"] = self.request_limit
        if self.api_key:
            data["api_key"] = "<redacted>"
        return data


def _problems(c: LoadConfig) -> list[str]:
    """Every reason the configuration is unusable."""
    return [message for bad, message in (*_value_checks(c), *_shape_checks(c)) if bad]


def _value_checks(c: LoadConfig) -> list[tuple[bool, str]]:
    """Each setting on its own: (is it wrong, why)."""
    counts = (
        ("max_concurrency", c.max_concurrency),
        ("concurrency", c.concurrency),
        ("num_requests", c.num_requests),
    )
    ranges = (("prompt_tokens", c.prompt_tokens), ("output_tokens", c.output_tokens))
    mix = c.priority_mix
    return [
        (
            c.endpoint not in ("completions", "chat"),
            f"endpoint must be 'completions' or 'chat', not {c.endpoint!r}",
        ),
        (not c.request_rate > 0, "request_rate must be > 0 (inf sends everything at once)"),
        (not c.burstiness > 0, "burstiness must be > 0"),
        *((value is not None and value < 1, f"{name} must be >= 1") for name, value in counts),
        (c.duration is not None and not c.duration > 0, "duration must be > 0"),
        (c.warmup < 0, "warmup must be >= 0"),
        (not c.timeout > 0, "timeout must be > 0"),
        *(
            (not 1 <= low <= high, f"{name} must satisfy 1 <= low <= high, got {low}:{high}")
            for name, (low, high) in ranges
        ),
        *(
            (
                metric not in SLO_METRICS or not ms > 0,
                f"goodput SLO {metric}:{ms} must be one of {SLO_METRICS} with a value > 0",
            )
            for metric, ms in c.goodput.items()
        ),
        (
            any(not 0 < p < 100 for p in c.percentiles),
            "percentiles must lie strictly between 0 and 100",
        ),
        (
            mix is not None
            and (not mix or any(w < 0 for _, w in mix) or sum(w for _, w in mix) <= 0),
            "priority_mix needs non-negative weights with a positive sum",
        ),
        (
            not c.tokens_per_second > 0 or c.prefill_seconds_per_token < 0,
            "tokens_per_second must be > 0 and prefill_seconds_per_token >= 0",
        ),
        (c.baseline_concurrency < 1, "baseline_concurrency must be >= 1"),
    ]


def _shape_checks(c: LoadConfig) -> list[tuple[bool, str]]:
    """Settings that contradict each other."""
    infinite = math.isinf(c.request_rate)
    ramp = c.ramp_up
    return [
        (
            ramp is not None and (ramp[0] < 0 or not ramp[1] > 0),
            "ramp_up needs START >= 0 and END > 0",
        ),
        (ramp is not None and not infinite, "ramp_up replaces request_rate; give one or the other"),
        (
            not c.closed_loop and infinite and ramp is None and c.request_limit is None,
            "an infinite request rate needs num_requests, not only a duration",
        ),
        (
            c.closed_loop and (not infinite or ramp is not None),
            "concurrency (closed loop) excludes request_rate and ramp_up",
        ),
        (
            c.closed_loop and c.max_concurrency is not None,
            "concurrency (closed loop) already caps in-flight; drop max_concurrency",
        ),
    ]


def parse_range(text: str) -> tuple[int, int]:
    """``"100"`` -> (100, 100); ``"50:200"`` -> (50, 200), an inclusive uniform range."""
    low, sep, high = text.partition(":")
    first = int(low)
    return (first, int(high) if sep else first)


def parse_pair(text: str) -> tuple[float, float]:
    """``"1:20"`` -> (1.0, 20.0), used by ``--ramp-up START:END``."""
    start, sep, end = text.partition(":")
    if not sep:
        raise ValueError(f"expected START:END, got {text!r}")
    return (float(start), float(end))


def parse_priority_mix(text: str) -> tuple[tuple[int, float], ...]:
    """``"0:0.2,5:0.8"`` -> ((0, 0.2), (5, 0.8)): priority and relative weight."""
    out: list[tuple[int, float]] = []
    for item in text.split(","):
        priority, sep, weight = item.strip().partition(":")
        if not sep:
            raise ValueError(f"expected PRIORITY:WEIGHT, got {item!r}")
        out.append((int(priority), float(weight)))
    return tuple(out)


def parse_goodput(items: list[str]) -> dict[str, float]:
    """``["ttft:500", "tpot:50"]`` -> {"ttft": 500.0, "tpot": 50.0} (milliseconds)."""
    out: dict[str, float] = {}
    for item in items:
        metric, sep, ms = item.partition(":")
        metric = metric.strip().lower()
        if not sep or metric not in SLO_METRICS:
            raise ValueError(f"expected one of {SLO_METRICS} as METRIC:MS, got {item!r}")
        out[metric] = float(ms)
    return out


def parse_percentiles(text: str) -> tuple[float, ...]:
    """``"50,90,99"`` -> (50.0, 90.0, 99.0)."""
    return tuple(float(p) for p in text.split(",") if p.strip())
