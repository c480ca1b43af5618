"""CPU per token through llmq in front of ``llama-server`` at saturation, by process.

``python -m bench.upstream_cpu [--runs N] [--shared] [--compare DIR | --direct]
[--beside direct|floor ...] [--tokens N] [--model tiny|small]``: the ``upstream``
scenario's closed loop of twice the server's slots (:mod:`bench.scenarios.upstream`)
through llmq 1+1 only (or, with ``--direct``, straight to the server), each run on a
server started for it (a server slows as it serves), with the server pinned to the
last CPU as in the scenario's "engine pinned" placement unless ``--shared``. Prints
each run's throughput and the CPU milliseconds each process spent per delivered
token, and llmq's over the server's (:func:`share`), then the medians. CPU per token
moves far less with the neighbours than latency does, so this is the figure to try a
change on the token path with: ``--compare DIR`` runs the llmq processes of another
checkout (an older commit made with ``git worktree add``) in turn with this one's,
run by run.

``--beside`` runs other systems in turn with llmq, run by run: ``direct`` (the load
straight to the server) and ``floor`` (the relay floor,
:mod:`bench.floor_via_redis` with ``--upstream``: every hop a request through llmq
makes and nothing else). With ``direct`` among the systems, each other system's
throughput is also given as its runs' shares of the direct run beside each: what
the scenario's throughput target judges, in more rounds than the scenario has time
for.

Each run also says what the scheduler did with the server's busiest thread, the one
that decodes (:func:`bench.sysinfo.busiest_thread`): its CPU seconds, the seconds it
waited runnable on a run queue, and how often it was preempted. Beside llmq on shared
CPUs that thread waits for a CPU far longer than direct
(docs/upstream-benchmark.md, "Shared CPUs: the engine waits for a CPU").
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, Literal

from bench import procs
from bench.report import fmt
from bench.scenarios.upstream import (
    SHAPES,
    Front,
    Placement,
    Sizes,
    llmq_env,
    placed,
    round_order,
    run_load,
    server_url,
    start_servers,
)
from bench.stats import median, median_of, medians, paired_ratios
from bench.sysinfo import busiest_thread, thread_sched
from cli.supervisor import LoggedProcess

#: The processes that are llmq's (beside the server and the load generator).
LLMQ_ROLES = ("api", "workers", "redis")
#: Seconds of load before each measured run: the worker's first connections, the
#: API's first streams.
WARM_S = 2.0
#: The systems ``--beside`` runs in turn with llmq; a run's system is one of them or
#: the checkout whose llmq it runs.
Other = Literal["direct", "floor"]
DIRECT: Other = "direct"
FLOOR: Other = "floor"
System = Path | Other


def _front(
    system: System, server: LoggedProcess, s: Sizes, log_dir: Path, on: ExitStack
) -> Front | None:
    """What a run's load goes through: llmq of the checkout ``system``, the relay floor,
    or nothing (direct)."""
    if not isinstance(system, Path):
        if system == DIRECT:
            return None
        upstream = server_url(server)
        return Front.of_floor(
            on.enter_context(procs.FloorServer(log_dir, 0.0, 0.0, upstream=upstream))
        )
    procs.ROOT = system  # children start from ROOT: it chooses the code they run
    stack = on.enter_context(procs.Stack(log_dir))
    stack.scale(1, llmq_env(server, s.model))
    return Front.of_stack(stack)


def _run(
    system: System,
    s: Sizes,
    model: Path,
    log_dir: Path,
    placement: Placement | None,
    seed: int,
) -> dict[str, Any]:
    """One run through ``system`` (:func:`_front`) to a server started for it."""
    users = 2 * s.slots
    with start_servers(1, model, s, log_dir, placement) as (server,), ExitStack() as on:
        urls = [server_url(server)]
        url, pids, redis_url = urls[0], {"llama": server.pid}, None
        if (front := _front(system, server, s, log_dir, on)) is not None:
            url, pids, redis_url = front.url, {**pids, **front.pids}, front.redis_url
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
        + (f"; failures: {'; '.join(run['errors'])}" if failed else "")
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
    parser.add_argument(
        "--beside",
        action="append",
        choices=(DIRECT, FLOOR),
        default=[],
        help="another system to run in turn with llmq, run by run (repeatable)",
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
    systems: dict[str, System] = {DIRECT: DIRECT} if args.direct else {"this": this}
    if args.compare:
        systems["other"] = args.compare
    for name in args.beside:
        systems[name] = name
    results: dict[str, list[dict[str, Any]]] = {}
    try:
        with placed(placement):
            for i in range(args.runs):
                for name in round_order(i, list(systems)):  # same prompts, own server
                    run = _run(systems[name], s, model, log_dir, placement, 1000 * (i + 1))
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
    if DIRECT in results and len(results) > 1:
        for name, runs in results.items():
            if name != DIRECT:
                print(_shares_row(name, runs, results[DIRECT]))


def _shares_row(name: str, runs: list[dict[str, Any]], direct: list[dict[str, Any]]) -> str:
    """``name``'s throughput as shares of the direct run of its round, run by run."""
    found = paired_ratios(runs, direct, "output_throughput")
    each = [x for x in found["each"] if x is not None]
    return (
        f"{name:6} share of direct {fmt(found['median'] * 100 if found['median'] else None)} % "
        f"(median; run by run {', '.join(fmt(x * 100) for x in each)})"
    )


if __name__ == "__main__":
    main()
