"""The per-request measurement and the clock that fills it, shared by every target.

Both targets (HTTP and the in-process baseline) measure through
:class:`StreamClock`, so TTFT, ITL, TPOT and E2E mean the same thing for both,
following vLLM's definitions:

* TTFT: from the send to the first chunk with non-empty content;
* ITL: the gaps between successive content chunks (a chunk may hold several
  tokens; it is still one gap, as in vLLM);
* TPOT: ``(e2e - ttft) / (output_tokens - 1)``, the decode time per token after
  the first; undefined (None) for a single-token output;
* E2E: from the send to the end of the stream.

Output tokens are the server's ``usage.completion_tokens`` when reported, else
the number of content chunks. All times are seconds; ``*_s`` offsets are
relative to the start of the measured run.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

FailureKind = Literal[
    "http_429", "http_4xx", "http_5xx", "timeout", "connection", "dropped", "server_error", "other"
]
FAILURE_KINDS: tuple[FailureKind, ...] = (
    "http_429",
    "http_4xx",
    "http_5xx",
    "timeout",
    "connection",
    "dropped",
    "server_error",
    "other",
)


class RequestFailed(Exception):
    """Raised by a target to end a request with a classified failure."""

    def __init__(self, kind: FailureKind, message: str) -> None:
        super().__init__(message)
        self.kind: FailureKind = kind
        self.message = message


@dataclass
class RequestMeasurement:
    """Everything measured about one request (successful or not).

    ``scheduled_s`` is when the request was due; ``sent_s`` when it left;
    ``slot_wait_s`` the time spent waiting for a concurrency slot (deliberate,
    not a load generator fault); ``lag_s = sent_s - scheduled_s - slot_wait_s``
    is how late the load generator itself was. ``ttft_s``/``itl_s`` are kept for
    failed requests too (up to the failure) but only successful ones enter the
    statistics; ``tpot_s`` and ``e2e_s`` are set for successful requests only.
    """

    index: int
    priority: int | None
    prompt_tokens: int
    max_tokens: int
    scheduled_s: float = 0.0
    sent_s: float = 0.0
    slot_wait_s: float = 0.0
    lag_s: float = 0.0
    end_s: float = 0.0
    output_tokens: int = 0
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    tpot_s: float | None = None
    e2e_s: float | None = None
    failure: FailureKind | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def status(self) -> str:
        return "ok" if self.failure is None else self.failure

    def chunk_times(self) -> list[float]:
        """Run-relative arrival times of the content chunks (for throughput over time)."""
        if self.ttft_s is None:
            return []
        times = [self.sent_s + self.ttft_s]
        for gap in self.itl_s:
            times.append(times[-1] + gap)
        return times

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status
        return data


class StreamClock:
    """Timestamps one request's stream; a target calls :meth:`sent` then :meth:`content`."""

    def __init__(self) -> None:
        self.sent_at = time.perf_counter()
        self.chunk_at: list[float] = []
        self.usage_tokens: int | None = None

    def sent(self) -> None:
        """Mark the moment the request leaves (just before the first byte is written)."""
        self.sent_at = time.perf_counter()

    def content(self) -> None:
        """Mark the arrival of a chunk carrying non-empty content."""
        self.chunk_at.append(time.perf_counter())

    def usage(self, completion_tokens: int) -> None:
        self.usage_tokens = completion_tokens

    def fill(
        self,
        measurement: RequestMeasurement,
        *,
        run_start: float,
        ended_at: float,
        failure: RequestFailed | None,
    ) -> RequestMeasurement:
        """Write what this clock timed into ``measurement`` and return it."""
        measurement.sent_s = self.sent_at - run_start
        measurement.end_s = ended_at - run_start
        if self.chunk_at:
            measurement.ttft_s = self.chunk_at[0] - self.sent_at
            measurement.itl_s = [
                b - a for a, b in zip(self.chunk_at, self.chunk_at[1:], strict=False)
            ]
        tokens = self.usage_tokens if self.usage_tokens is not None else len(self.chunk_at)
        measurement.output_tokens = tokens
        if failure is not None:
            measurement.failure, measurement.error = failure.kind, failure.message
            return measurement
        e2e = ended_at - self.sent_at
        measurement.e2e_s = e2e
        if measurement.ttft_s is not None and tokens > 1:
            measurement.tpot_s = (e2e - measurement.ttft_s) / (tokens - 1)
        return measurement
