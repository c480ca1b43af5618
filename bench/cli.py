"""The ``python -m bench`` command: pick scenarios, run them, write and print the results.

A failing scenario is recorded (with its error) and the next one still runs, so
one broken part does not cost the other figures. Ctrl-C or SIGTERM stops the
current scenario's processes through the normal unwinding, writes what was
measured so far, and exits 130.
"""

from __future__ import annotations

import argparse
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from bench import report
from bench.scenario import Context, ScenarioResult
from bench.scenarios import ON_REQUEST, SCENARIOS
from bench.sysinfo import machine_info
from llmq.embedded import find_redis_server


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--scenarios",
        default=",".join(SCENARIOS),
        help=f"comma-separated subset of {','.join(SCENARIOS)} (default: all), or of "
        f"{','.join(ON_REQUEST)} (run only when named)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs per system (default 3)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (for the smoke test)")
    parser.add_argument(
        "--traces", default="", help="comma-separated traces to run (autoscale; default: all)"
    )
    parser.add_argument(
        "--policies",
        default="",
        help="comma-separated policies to run (autoscale, routing; default: all)",
    )
    parser.add_argument(
        "--systems", default="", help="comma-separated systems to compare (capacity; default: all)"
    )
    parser.add_argument(
        "--levels", default="", help="comma-separated stream counts (capacity; default: its own)"
    )
    parser.add_argument("--seed", type=int, default=None, help="chaos: the campaign's seed")
    parser.add_argument(
        "--duration", type=float, default=None, help="chaos: seconds of faults (default 300)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results folder (default: $LLMQ_CACHE/bench-results, else "
        "~/.cache/llmq/bench-results)",
    )
    parser.add_argument(
        "--name",
        default=None,
        help="the results' file name without suffix (default: the UTC timestamp, "
        "and a copy as latest.md)",
    )
    return parser


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


def _levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(n) for n in _names(text))
    except ValueError:
        raise SystemExit(f"--levels takes stream counts, not {text!r}") from None
    if any(n < 1 for n in levels):
        raise SystemExit("--levels must be >= 1")
    return levels


def _scenarios(text: str) -> list[str]:
    names = list(_names(text))
    unknown = [n for n in names if n not in SCENARIOS and n not in ON_REQUEST]
    if unknown or not names:
        known = ", ".join([*SCENARIOS, *ON_REQUEST])
        raise SystemExit(f"unknown scenarios {unknown}; choose from {known}")
    return names


def _redis_version() -> str:
    try:
        out = subprocess.run(
            [find_redis_server(), "--version"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError, RuntimeError):
        return "unknown"
    found = re.search(r"v=(\S+)", out)
    return found.group(1) if found else out.strip()


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _markdown(
    stamp: str,
    info: dict[str, Any],
    args: argparse.Namespace,
    results: list[ScenarioResult],
    interrupted: bool,
) -> str:
    head = [
        f"# llmq benchmark {stamp}",
        "",
        f"{info['cpu_count']} CPUs ({info['cpu_model']}), Python {info['python']}, "
        f"Redis {info['redis_version']}, commit `{info['git_commit'][:12]}`"
        f"{' (dirty)' if info['git_dirty'] else ''}, load average at start "
        f"{info['loadavg_at_start'][0]:.2f}. Repeats: {args.repeats}"
        f"{', quick sizes' if args.quick else ''}. "
        f"Wall time {info['wall_s']:.0f} s. Command: `{info['command']}`.",
        *(["", "**Interrupted**: only the scenarios below finished."] if interrupted else []),
        "",
        "## Targets",
        "",
        report.table(
            ["scenario", "target", "result", "detail"],
            [
                [
                    r.name,
                    t.description,
                    {True: "met", False: "**MISSED**", None: "n/a"}[t.met],
                    t.detail,
                ]
                for r in results
                for t in r.targets
            ],
        ),
    ]
    sections = [f"## {r.name}: {r.title}\n\n{r.markdown}" for r in results]
    return "\n".join(head) + "\n\n" + "\n\n".join(sections) + "\n"


def _failed(name: str, exc: BaseException, log_dir: Path) -> ScenarioResult:
    detail = f"{type(exc).__name__}: {exc}"
    md = f"**Failed**: `{detail[:2000]}`\n\nProcess logs were kept in `{log_dir}`."
    data = {"error": detail, "traceback": traceback.format_exc()}
    return ScenarioResult(name, "failed", data, md, [])


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    names = _scenarios(args.scenarios)
    if args.repeats < 1:
        raise SystemExit("--repeats must be >= 1")
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with it ignored
    stamp = report.timestamp()
    log_dir = Path(tempfile.mkdtemp(prefix="llmq-bench-"))
    ctx = Context(
        repeats=args.repeats,
        quick=args.quick,
        log_dir=log_dir,
        traces=_names(args.traces),
        policies=_names(args.policies),
        systems=_names(args.systems),
        levels=_levels(args.levels),
        seed=args.seed,
        duration=args.duration,
    )
    info = machine_info()
    info["redis_version"] = _redis_version()
    info["command"] = " ".join(["python -m bench", *(argv if argv is not None else sys.argv[1:])])
    info["hostname"] = platform.node()
    started = time.monotonic()
    results: list[ScenarioResult] = []
    interrupted = False
    keep_logs = False
    try:
        for name in names:
            ctx.say(f"scenario {name}")
            began = time.monotonic()
            try:
                result = {**SCENARIOS, **ON_REQUEST}[name](ctx)
            except Exception as exc:
                keep_logs = True
                ctx.say(f"scenario {name} failed: {type(exc).__name__}: {exc}")
                result = _failed(name, exc, log_dir)
            result.wall_s = time.monotonic() - began
            ctx.say(f"scenario {name} took {result.wall_s:.0f} s")
            results.append(result)
    except KeyboardInterrupt:
        interrupted = True
        ctx.say("interrupted: writing what was measured")
    info["wall_s"] = time.monotonic() - started
    payload = {
        "timestamp": stamp,
        "command": info["command"],
        "options": {
            "scenarios": names,
            "repeats": args.repeats,
            "quick": args.quick,
            "traces": list(ctx.traces),
            "policies": list(ctx.policies),
            "systems": list(ctx.systems),
            "levels": list(ctx.levels),
            "seed": ctx.seed,
            "duration": ctx.duration,
        },
        "machine": info,
        "interrupted": interrupted,
        "scenarios": {r.name: r.to_dict() for r in results},
    }
    markdown = _markdown(stamp, info, args, results, interrupted)
    out = args.out if args.out is not None else report.results_dir()
    paths = report.write(out, stamp, payload, markdown, args.name)
    print(markdown)
    ctx.say("wrote " + ", ".join(str(p) for p in paths))
    if keep_logs:
        ctx.say(f"process logs kept in {log_dir}")
    else:
        shutil.rmtree(log_dir, ignore_errors=True)
    if interrupted:
        return 130
    return 1 if keep_logs else 0
