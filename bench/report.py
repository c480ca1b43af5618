"""Turning results into files: one JSON with every figure, one markdown for people.

The JSON is the record (settings, machine, each run's figures, the medians); the
markdown is a view of it, so a table can always be checked against the JSON of
the same name. A run is named by its UTC timestamp unless it is given a name, and
``latest.md`` is then a copy of the newest markdown for a stable link.

Results go outside the checkout unless asked: :func:`results_dir`. The repository
keeps one named result per scenario that the docs cite (``bench/results/``).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def fmt(value: Any, digits: int = 1, unit: str = "") -> str:
    """A cell: numbers rounded, None as an em dash."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value}{unit}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.{digits}f}{unit}"
    return f"{value}{unit}"


def pct(value: float | None, digits: int = 0) -> str:
    """A share (0..1) as a percentage."""
    return "—" if value is None else f"{value * 100:.{digits}f}%"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out.extend("| " + " | ".join(row) + " |" for row in rows)
    return "\n".join(out)


def target_line(description: str, met: bool | None, detail: str) -> str:
    mark = {True: "met", False: "MISSED", None: "n/a"}[met]
    return f"**Target:** {description}: **{mark}** ({detail})"


def timestamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def results_dir() -> Path:
    """Where results go by default: ``bench-results`` in llmq's cache
    (``$LLMQ_CACHE``, else ``~/.cache/llmq``, as the engine builds use), outside
    the checkout."""
    cache = os.environ.get("LLMQ_CACHE") or Path.home() / ".cache" / "llmq"
    return Path(cache) / "bench-results"


def write(
    out: Path, stamp: str, payload: dict[str, Any], markdown: str, name: str | None = None
) -> list[Path]:
    """Write ``<name>.json`` and ``<name>.md`` under ``out``; without a name,
    ``<stamp>.json``, ``<stamp>.md`` and a copy of the markdown as ``latest.md``."""
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / f"{name or stamp}.json"
    md_path = out / f"{name or stamp}.md"
    json_path.write_text(json.dumps(_jsonable(payload), indent=1) + "\n")
    md_path.write_text(markdown)
    if name:
        return [json_path, md_path]
    latest = out / "latest.md"
    shutil.copyfile(md_path, latest)
    return [json_path, md_path, latest]
