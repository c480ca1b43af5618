"""``make soak``: steady load for a while, and proof that nothing grows.

Runs the stack (embedded Redis, one API, two workers) under a closed loop of
constant concurrency for ``--duration`` seconds and samples, every
``--interval`` seconds: the resident memory of every process, the Redis key
count, Redis memory and its connected clients. A resource is *flat* when its
average over the last third of the run is within ``--tolerance`` of its average
over the middle third (the first third is warm-up: pools fill, caches settle).
The report goes to ``soak-<timestamp>.{json,md}`` under ``--out`` (default
:func:`bench.report.results_dir`, outside the checkout); the exit code
is non-zero if anything grew.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis

from bench.procs import Stack
from bench.report import results_dir
from llmq.protocol import keys
from loadgen import LoadConfig, run_load


def rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def sample(stack: Stack, client: redis.Redis) -> dict[str, float]:
    info: dict[str, Any] = client.info()  # type: ignore[assignment]
    out: dict[str, float] = {f"rss_{name}": rss_bytes(pid) for name, pid in stack.pids().items()}
    out["redis_keys"] = float(client.dbsize())  # type: ignore[arg-type]
    out["redis_used_memory"] = float(info["used_memory"])
    out["redis_clients"] = float(info["connected_clients"])
    lengths: list[int] = [client.xlen(k) for k in keys.LIFECYCLES]  # type: ignore[misc]
    out["lifecycle_entries"] = float(sum(lengths))
    return out


def verdict(series: list[dict[str, float]], tolerance: float) -> dict[str, dict[str, Any]]:
    third = max(1, len(series) // 3)
    middle, last = series[third : 2 * third], series[-third:]
    result: dict[str, dict[str, Any]] = {}
    for key in series[0]:
        before = statistics.fmean(s[key] for s in middle) if middle else series[0][key]
        after = statistics.fmean(s[key] for s in last)
        growth = (after - before) / before if before else 0.0
        slack = 4.0 if key == "redis_clients" else 0.0  # a few connections come and go
        flat = after <= before * (1 + tolerance) + slack
        result[key] = {"middle": before, "last": after, "growth": growth, "flat": flat}
    return result


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# llmq soak {report['started']}",
        "",
        f"{report['duration_s']:.0f} s at {report['concurrency']} concurrent streams, "
        f"{report['completed']} requests completed, {report['failed']} failed. "
        f"Command: `{report['command']}`.",
        "",
        "| resource | middle third | last third | growth | flat |",
        "|---|---|---|---|---|",
    ]
    for key, v in report["verdict"].items():
        lines.append(
            f"| {key} | {v['middle']:.0f} | {v['last']:.0f} | {v['growth']:+.1%} | "
            f"{'yes' if v['flat'] else '**no**'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    parser.add_argument("--duration", type=float, default=300.0)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=24)
    parser.add_argument("--tolerance", type=float, default=0.10)
    parser.add_argument("--out", type=Path, default=None, help="results folder")
    parser.add_argument("--name", default=None, help="file name without suffix")
    args = parser.parse_args(argv)
    started = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    series: list[dict[str, float]] = []
    # Bounds small enough to be reached within the run, so that "flat" proves them:
    # request keys expire after 30 s, the lifecycle stream stops at ~5,000 entries.
    bounds = {"LLMQ_REQUEST_TTL_SECONDS": "30", "LLMQ_LIFECYCLE_MAXLEN": "5000"}
    worker_env = {"LLMQ_CONCURRENCY": str(args.concurrency), **bounds}
    with (
        tempfile.TemporaryDirectory() as logs,
        Stack(Path(logs), bounds) as stack,
    ):
        stack.scale(2, worker_env)
        client = redis.Redis.from_url(stack.redis.url)
        done = threading.Event()

        def sampler() -> None:
            while not done.wait(args.interval):
                series.append(sample(stack, client))

        thread = threading.Thread(target=sampler, daemon=True)
        thread.start()
        config = LoadConfig(
            base_url=stack.url,
            concurrency=args.concurrency,
            duration=args.duration,
            prompt_tokens=(20, 200),
            output_tokens=(10, 60),
            seed=1,
        )
        result = asyncio.run(run_load(config))
        done.set()
        thread.join()
    summary = result.summary()
    report = {
        "started": started,
        "command": "make soak",
        "duration_s": args.duration,
        "concurrency": args.concurrency,
        "completed": summary["completed"],
        "failed": summary["failed"],
        "samples": series,
        "verdict": verdict(series, args.tolerance),
    }
    out = args.out if args.out is not None else results_dir()
    out.mkdir(parents=True, exist_ok=True)
    name = args.name or f"soak-{started}"
    (out / f"{name}.json").write_text(json.dumps(report, indent=2))
    text = markdown(report)
    (out / f"{name}.md").write_text(text)
    print(text)
    flat = all(v["flat"] for v in report["verdict"].values())
    return 0 if flat and not summary["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
