"""The outcome of one run: its settings, every request's measurement, and its figures."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loadgen.config import LoadConfig
from loadgen.figures import summarize
from loadgen.measurements import RequestMeasurement

ALWAYS_PERCENTILES = (50.0, 90.0, 99.0)  # in every summary, whatever the table shows


@dataclass
class RunResult:
    """What :func:`loadgen.runner.run_load` returns.

    ``measurements`` are the measured requests in index order; ``warmup_measurements`` the
    warmup requests sent before the measured run (never in the figures).
    ``duration_s`` runs from the measured run's start to its last request's end;
    ``started_at`` is the Unix time of that start. ``target`` is ``"http"`` or
    ``"in_process"``.
    """

    config: LoadConfig
    measurements: list[RequestMeasurement]
    duration_s: float
    started_at: float
    target: str
    warmup_measurements: list[RequestMeasurement] = field(default_factory=list)
    _summary: dict[str, Any] | None = field(default=None, repr=False)

    def summary(self) -> dict[str, Any]:
        """The figures (see :mod:`loadgen.figures`), computed once.

        The p50/p90/p99 keys are always present so callers can rely on them; other
        percentiles come from ``config.percentiles``.
        """
        if self._summary is None:
            self._summary = summarize(
                self.measurements,
                duration_s=self.duration_s,
                percentiles=sorted({*self.config.percentiles, *ALWAYS_PERCENTILES}),
                slos_ms=self.config.goodput,
                lag_threshold_ms=self.config.lag_threshold_ms,
            )
            self._summary["target"] = self.target
            self._summary["warmup"] = len(self.warmup_measurements)
            self._summary["max_concurrency"] = self.config.slots
        return self._summary

    @property
    def lagged(self) -> bool:
        return bool(self.summary()["lagged"])

    def to_json(self) -> dict[str, Any]:
        """Settings, figures and every measurement: the ``--output`` file's content."""
        return {
            "settings": self.config.to_dict(),
            "target": self.target,
            "started_at": self.started_at,
            "duration_s": self.duration_s,
            "lagged": self.lagged,
            "summary": self.summary(),
            "requests": [r.to_dict() for r in self.measurements],
            "warmup_requests": [r.to_dict() for r in self.warmup_measurements],
        }
