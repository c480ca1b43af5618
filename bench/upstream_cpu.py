"""CPU per token through llmq in front of ``llama-server`` at saturation, by process.

``python -m bench.upstream_cpu [--runs N] [--shared] [--compare DIR | --direct]
[--tokens N] [--model tiny|small]``: the ``upstream`` scenario's closed loop of twice
the server's slots (:mod:`bench.scenarios.upstream`) through llmq 1+1 only (or, with
``--direct``, straight to the server), each run on a server started for it (a server
slows as it serves), with the server pinned to the last CPU as in the scenario's
"engine pinned" placement unless ``--shared``. Prints each run's throughput and the
CPU milliseconds each process spent per delivered token, and llmq's over the server's
(:func:`share`), then the medians. CPU per token moves far less with the neighbours
than latency does, so this is the figure to try a change on the token path with:
``--compare DIR`` runs the llmq processes of another checkout (an older commit made
with ``git worktree add``) in turn with this one's, run by run.

Each run also says what the scheduler did with the server's busiest thread, the one
that decodes (:func:`bench.sysinfo.busiest_thread`): its CPU seconds, the seconds it
waited runnable on a run queue, and how often it was preempted. Beside llmq on shared
CPUs that thread waits for a CPU far longer than direct
(docs/upstream-benchmark.md, "Shared CPUs: the engine waits for a CPU").
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from bench import procs
from bench.report import fmt
from bench.scenarios.upstream import (
    SHAPES,
    Placement,
    Sizes,
    llmq_env,
    placed,
    run_load,
    server_url,
    start_servers,
)
from bench.stats import median, median_of, medians
from bench.sysinfo import busiest_thread, thread_sched

#: The processes that are llmq's (beside the server and the load generator).
LLMQ_ROLES = ("api", "workers", "redis")
#: Seconds of load before each measured run: the worker's first connections, the
#: API's first streams.
WARM_S = 2.0


def _run(
    root: Path | None,
    s: Sizes,
    model: Path,
    log_dir: Path,
    placement: Placement | None,
    seed: int,
) -> dict[str, Any]:
    """One run through the llmq processes of ``root``, or straight to the server (None)."""
    users = 2 * s.slots
    with start_servers(1, model, s, log_dir, placement) as (server,), contextlib.ExitStack() as on:
        urls = [server_url(server)]
        url, pids, redis_url = urls[0], {"llama": server.pid}, None
        if root is not None:
            procs.ROOT = root  # children start from ROOT: it chooses the code they run
            stack = on.enter_context(procs.Stack(log_dir))
            stack.scale(1, llmq_env(server, s.model))
            url, pids, redis_url = stack.url, {**pids, **stack.pids()}, stack.redis.url
        load = partial(run_load, url, pids, redis_url, s, users, servers=urls)
        load(min(WARM_S, s.saturated_s), seed)
        before = thread_sched(server.pid)
        run = load(s.saturated_s, seed + 1)
        run["server_thread"] = busiest_thread(before, thread_sched(server.pid))
        return run


def share(run: dict[str, Any]) -> float | None:
    """llmq's CPU per token (API, workers, Redis) over the server's: the pinned server
    runs alone on its CPU, so this cancels most of a VM's drift in speed from run to
    run, which moves every process's CPU per token together. None for a direct run."""
    per = run["cpu_ms_per_token"]
    if not all(r in per for r in LLMQ_ROLES):
        return None
    return float(sum(per[r] for r in LLMQ_ROLES) / per["llama"])


def _row(name: str, run: dict[str, Any]) -> str:
    per = " ".join(f"{role}={value:.3f}" for role, value in run["cpu_ms_per_token"].items())
    tok_s, failed, batch = run["output_throughput"], run["failed"], run["tokens_per_step"]
    ratio = share(run)
    thread = run["server_thread"]
    return (
        f"{name:6} {tok_s:7.1f} tok/s, failed {failed}, CPU ms/token {per}"
        + ("" if ratio is None else f", llmq/server {ratio:.3f}")
        + f", server's batch {fmt(batch, 2)} tokens/step, its decoding thread: "
        f"CPU {thread.cpu_s:.2f} s, waited {thread.waited_s:.2f} s, "
        f"preempted {thread.preempted} times"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.upstream_cpu", description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--shared", action="store_true", help="the server on any CPU")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--compare", type=Path, help="another checkout to alternate with")
    which.add_argument(
        "--direct", action="store_true", help="the load straight to the server, no llmq"
    )
    parser.add_argument("--seconds", type=float, default=Sizes().saturated_s, help="per run")
    parser.add_argument(
        "--tokens",
        type=int,
        default=Sizes().output_tokens,
        help="output tokens per request (runs at several split a process's CPU into "
        "what it spends per request and per token)",
    )
    parser.add_argument(
        "--model", choices=sorted(SHAPES), default=Sizes().model, help="the served random model"
    )
    args = parser.parse_args(argv)
    s = replace(Sizes(), saturated_s=args.seconds, output_tokens=args.tokens, model=args.model)
    placement = None if args.shared else Placement.for_engines(1)
    log_dir = Path(tempfile.mkdtemp(prefix="llmq-upstream-cpu-"))
    model = s.write_model(log_dir)
    this = procs.ROOT
    roots: dict[str, Path | None] = {"direct": None} if args.direct else {"this": this}
    if args.compare:
        roots["other"] = args.compare
    results: dict[str, list[dict[str, Any]]] = {}
    try:
        with placed(placement):
            for i in range(args.runs):
                for name, root in roots.items():  # the same prompts, on a server of its own
                    run = _run(root, s, model, log_dir, placement, 1000 * (i + 1))
                    results.setdefault(name, []).append(run)
                    print(_row(name, run), flush=True)
    finally:
        procs.ROOT = this
    for name, runs in results.items():
        per = medians([x["cpu_ms_per_token"] for x in runs], runs[0]["cpu_ms_per_token"])
        text = " ".join(f"{role}={fmt(value, 3)}" for role, value in per.items())
        tok_s = median_of(runs, "output_throughput")
        ratios = [r for r in map(share, runs) if r is not None]
        ratio = f", llmq/server {fmt(median(ratios), 3)}" if ratios else ""
        print(f"{name:6} median {fmt(tok_s, 1):>7} tok/s, CPU ms/token {text}{ratio}")


if __name__ == "__main__":
    main()
