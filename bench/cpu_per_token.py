"""CPU per delivered token at one fixed load, by process: the figure to optimise by.

Latency on a shared machine moves with the neighbours; CPU seconds per token
moves far less. ``python -m bench.cpu_per_token --streams 60 --runs 3`` runs the
capacity scenario's closed loop at one level (llmq, and with ``--floor`` the
floor too) and prints the CPU milliseconds each process spent per delivered
token. ``--root DIR`` runs the llmq processes from another checkout (e.g. an
older commit exported with ``git archive``), so the code before and after a
change can be measured alternately in one command with ``--compare DIR``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench import procs
from bench.scenarios import capacity


def _row(name: str, run: dict[str, Any]) -> str:
    per = run["cpu_ms_per_token"]
    parts = " ".join(f"{role}={value:.4f}" for role, value in per.items())
    return (
        f"{name:8} ITL p99 {run['itl_ms_p99']:.1f} ms, {run['output_throughput']:.0f} tok/s, "
        f"others {run['cpus_others']:.2f} cores, CPU ms/token {parts}"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu_per_token", description=__doc__)
    parser.add_argument("--streams", type=int, default=60)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--floor", action="store_true", help="also measure the floor")
    parser.add_argument("--compare", type=Path, help="another checkout to alternate with")
    args = parser.parse_args(argv)
    sizes = replace(capacity.Sizes(), duration_s=args.duration)
    log_dir = Path(tempfile.mkdtemp(prefix="llmq-cpu-"))
    roots = {"after": procs.ROOT, **({"before": args.compare} if args.compare else {})}
    results: dict[str, list[dict[str, Any]]] = {}
    stacks: dict[str, procs.Stack] = {}
    floor: procs.FloorServer | None = None
    try:
        for name, root in roots.items():
            # Children start from ROOT, so it chooses the code they run; the workers are
            # started here with the runner's settings, so that it does not restart them.
            procs.ROOT = root
            stacks[name] = procs.Stack(log_dir).__enter__()
            stacks[name].scale(sizes.workers, capacity.worker_env(sizes, args.streams))
        procs.ROOT = roots["after"]
        runners = {name: capacity._llmq_runner(stack, sizes) for name, stack in stacks.items()}
        if args.floor:
            floor = procs.FloorServer(log_dir, sizes.tokens_per_second, 0.0001).__enter__()
            runners["floor"] = capacity._floor_runner(floor, sizes)
        for i in range(args.runs):
            for name, runner in runners.items():
                run = runner(args.streams, 1000 + i)
                results.setdefault(name, []).append(run)
                print(_row(name, run), flush=True)
    finally:
        for stack in stacks.values():
            stack.close()
        if floor is not None:
            floor.__exit__(None, None, None)
    for name, runs in results.items():
        roles = runs[0]["cpu_ms_per_token"]
        medians = {r: statistics.median(x["cpu_ms_per_token"][r] for x in runs) for r in roles}
        text = " ".join(f"{r}={v:.4f}" for r, v in medians.items())
        print(f"{name:8} median CPU ms/token {text}")


if __name__ == "__main__":
    main()
