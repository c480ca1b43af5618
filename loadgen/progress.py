"""A live progress bar on stderr, so stdout stays clean for the summary.

rich redraws from its own thread a few times a second; the event loop only bumps
counters, so the bar costs the measurement next to nothing.
"""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from loadgen.measurements import RequestMeasurement


class RunProgress:
    """Counts finished requests; a no-op when disabled."""

    def __init__(self, total: int | None, *, enabled: bool, label: str = "requests") -> None:
        self._label = label
        self._failed = 0
        self._progress: Progress | None = None
        if enabled:
            self._progress = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                refresh_per_second=4,
            )
            self._task = self._progress.add_task(label, total=total)

    def __enter__(self) -> RunProgress:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._progress is not None:
            self._progress.stop()

    def done(self, measurement: RequestMeasurement) -> None:
        if self._progress is None:
            return
        if not measurement.ok:
            self._failed += 1
            description = f"{self._label} ({self._failed} failed)"
            self._progress.update(self._task, advance=1, description=description)
        else:
            self._progress.advance(self._task)
