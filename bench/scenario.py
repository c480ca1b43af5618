"""What every scenario receives and returns, and how compared systems take turns.

A scenario is a function ``run(ctx) -> ScenarioResult``. It owns its processes
(started and stopped inside it), returns every figure for the JSON and a
markdown section for people, and states its targets as data so the summary can
list what was met and what was missed.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Context:
    """Run-wide options: ``repeats`` per comparison, ``quick`` tiny sizes, a log folder;
    ``traces``/``policies``: a subset of a scenario's traces or policies to run (empty:
    all), for iterating on one part without the whole run (the autoscale scenario reads
    them); ``systems``/``levels``: likewise the compared systems and the load levels
    (the capacity scenario reads them); ``seed``/``duration``: the chaos campaign's."""

    repeats: int
    quick: bool
    log_dir: Path
    traces: tuple[str, ...] = ()
    policies: tuple[str, ...] = ()
    systems: tuple[str, ...] = ()
    levels: tuple[int, ...] = ()
    #: The chaos campaign's seed and length (seconds); None: its defaults.
    seed: int | None = None
    duration: float | None = None
    started: float = field(default_factory=time.monotonic)

    def say(self, message: str) -> None:
        """Progress on stderr (the markdown goes to stdout at the end)."""
        elapsed = time.monotonic() - self.started
        print(f"[bench {elapsed:6.1f}s] {message}", file=sys.stderr, flush=True)


@dataclass
class Target:
    description: str
    met: bool | None
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"description": self.description, "met": self.met, "detail": self.detail}


@dataclass
class ScenarioResult:
    name: str
    title: str
    data: dict[str, Any]
    markdown: str
    targets: list[Target]
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "wall_s": self.wall_s,
            "targets": [t.to_dict() for t in self.targets],
            **self.data,
        }


Run = Callable[[int], dict[str, Any]]


def interleave(
    ctx: Context, repeats: int, systems: Sequence[tuple[str, Run]]
) -> dict[str, list[dict[str, Any]]]:
    """Run each system once per repeat in turn (A, B, A, B...), so noise hits both.

    Each callable gets the repeat index and returns that run's figures.
    """
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in systems}
    for i in range(repeats):
        for name, run in systems:
            ctx.say(f"  {name} run {i + 1}/{repeats}")
            runs[name].append(run(i))
    return runs
