"""PNG plots of a run, drawn with matplotlib's object API and the Agg canvas.

No ``pyplot``: plots are plain :class:`~matplotlib.figure.Figure` objects, so
nothing touches global state or needs a display, and plotting is safe inside a
server process or a test run.

Files: ``latency_cdf.png`` (TTFT, TPOT, ITL, E2EL), ``ttft_over_time.png``,
``throughput_over_time.png`` (completed requests and output tokens per second,
tokens spread over their chunks' arrival times) and ``ttft_by_priority.png``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from loadgen.figures import metric_values
from loadgen.measurements import RequestMeasurement
from loadgen.result import RunResult

BINS = 40


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def _cdf(ax: Axes, values_s: list[float], label: str | None = None) -> None:
    if not values_s:
        return
    ms = np.sort(np.asarray(values_s, dtype=float) * 1000.0)
    ax.step(ms, np.arange(1, ms.size + 1) / ms.size, where="post", label=label)


def latency_cdfs(result: RunResult, path: Path) -> Path:
    fig = Figure(figsize=(10, 7))
    titles = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2E latency"}
    for number, (metric, title) in enumerate(titles.items(), start=1):
        ax = fig.add_subplot(2, 2, number)
        values = metric_values(result.measurements, metric)
        _cdf(ax, values)
        ax.set_title(f"{title} CDF (n={len(values)})")
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of requests" if metric != "itl" else "fraction of gaps")
        ax.grid(alpha=0.3)
    return _save(fig, path)


def ttft_over_time(result: RunResult, path: Path) -> Path:
    fig = Figure(figsize=(10, 4))
    ax = fig.add_subplot(1, 1, 1)
    ok = [r for r in result.measurements if r.ok and r.ttft_s is not None]
    ax.scatter([r.sent_s for r in ok], [(r.ttft_s or 0.0) * 1000 for r in ok], s=6, alpha=0.6)
    failed = [r for r in result.measurements if not r.ok]
    if failed:
        ax.scatter(
            [r.sent_s for r in failed],
            [0.0] * len(failed),
            s=10,
            c="red",
            marker="x",
            label=f"failed ({len(failed)})",
        )
        ax.legend()
    ax.set_title("TTFT by send time")
    ax.set_xlabel("send time (s since start)")
    ax.set_ylabel("TTFT (ms)")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def _buckets(duration: float) -> npt.NDArray[np.float64]:
    return np.linspace(0.0, max(duration, 1e-3), BINS + 1)


def throughput_over_time(result: RunResult, path: Path) -> Path:
    fig = Figure(figsize=(10, 4))
    ax = fig.add_subplot(1, 1, 1)
    edges = _buckets(result.duration_s)
    width = float(edges[1] - edges[0])
    token_times: list[float] = []
    token_weights: list[float] = []
    for r in result.measurements:
        times = r.chunk_times() if r.ok else []
        if times:
            token_times.extend(times)
            token_weights.extend([r.output_tokens / len(times)] * len(times))
    tokens, _ = np.histogram(token_times, bins=edges, weights=token_weights)
    done, _ = np.histogram([r.end_s for r in result.measurements if r.ok], bins=edges)
    mids = (edges[:-1] + edges[1:]) / 2
    ax.plot(mids, tokens / width, label="output tokens/s")
    ax.set_xlabel("time (s since start)")
    ax.set_ylabel("output tokens/s")
    twin = ax.twinx()
    twin.plot(mids, done / width, color="tab:orange", label="completed requests/s")
    twin.set_ylabel("requests/s")
    ax.set_title("Throughput over time")
    lines = [*ax.get_lines(), *twin.get_lines()]
    ax.legend(lines, [str(line.get_label()) for line in lines], loc="upper left")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def ttft_by_priority(result: RunResult, path: Path) -> Path:
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot(1, 1, 1)
    groups: dict[int | None, list[RequestMeasurement]] = {}
    for r in result.measurements:
        groups.setdefault(r.priority, []).append(r)
    for priority in sorted(groups, key=lambda p: (p is None, p or 0)):
        values = metric_values(groups[priority], "ttft")
        name = "none" if priority is None else str(priority)
        _cdf(ax, values, label=f"priority {name} (n={len(values)})")
    ax.set_title("TTFT CDF by priority")
    ax.set_xlabel("TTFT (ms)")
    ax.set_ylabel("fraction of requests")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    return _save(fig, path)


def write_plots(result: RunResult, directory: str | Path) -> list[Path]:
    """Draw every plot into ``directory`` (created) and return the files."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    return [
        latency_cdfs(result, out / "latency_cdf.png"),
        ttft_over_time(result, out / "ttft_over_time.png"),
        throughput_over_time(result, out / "throughput_over_time.png"),
        ttft_by_priority(result, out / "ttft_by_priority.png"),
    ]
