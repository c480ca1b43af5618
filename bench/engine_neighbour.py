"""How fast the server on one CPU runs depending on what the other CPUs do.

``python -m bench.engine_neighbour [--model tiny|small] [--rounds N] [--seconds S]
[--halt-poll-ns NS,...]``: one ``llama-server`` pinned to the last CPU, as in the
``upstream`` scenario's "engine pinned" placement, and the load generator on the
other CPUs sending it twice its slots in a closed loop, straight to the server. Each
round runs three conditions in turn on that one server: the other CPUs left to the
load generator (idle between its reads), kept busy by a Python loop, and kept busy
by summing a 64 MiB array. Prints each run's throughput and the server's CPU
milliseconds per token, then the medians per condition.

Why: the pinned placement stands for an engine whose compute is its own, and its
direct runs leave the other CPU mostly idle while llmq's runs keep it busy. On a
virtual machine an idle virtual CPU may halt at once (the guests here boot with
``haltpoll.guest_halt_poll_ns=0``), and waking a halted one goes through the
hypervisor; how much that changes the server's own speed is what this measures.
``--halt-poll-ns`` runs every round once per value of the guest's halt polling (the
time an idle virtual CPU polls before it halts, as a latency-tuned host sets it),
which needs root and the ``haltpoll`` driver, and puts the old value back at the end.
"""

from __future__ import annotations

import argparse
import itertools
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.report import fmt
from bench.scenarios.upstream import (
    SHAPES,
    Placement,
    Sizes,
    placed,
    run_load,
    server_url,
    start_servers,
)
from bench.stats import median_of

#: The guest's halt polling (Linux's ``cpuidle-haltpoll`` driver), in nanoseconds.
HALT_POLL = Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns")
#: What runs beside the load generator on the other CPUs (None: nothing).
NEIGHBOURS: dict[str, str | None] = {
    "idle": None,
    "python loop": "import itertools\nx = 0\nfor i in itertools.count():\n    x ^= i",
    "numpy 64 MiB": "import numpy as np\na = np.ones(2**23)\nwhile True:\n    a.sum()",
}


@contextmanager
def halt_poll(ns: int | None) -> Iterator[None]:
    """The guest's halt polling set to ``ns`` until the block ends (None: left as is)."""
    if ns is None:
        yield
        return
    old = HALT_POLL.read_text().strip()
    HALT_POLL.write_text(str(ns))
    try:
        yield
    finally:
        HALT_POLL.write_text(old)


def _run(url: str, pid: int, s: Sizes, neighbour: str | None, seed: int) -> dict[str, Any]:
    """One closed-loop run straight to the server, ``neighbour`` running meanwhile."""
    busy = None if neighbour is None else subprocess.Popen([sys.executable, "-c", neighbour])
    try:
        return run_load(
            url, {"llama": pid}, None, s, 2 * s.slots, s.saturated_s, seed, servers=[url]
        )
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.engine_neighbour", description=__doc__)
    parser.add_argument("--model", choices=sorted(SHAPES), default=Sizes().model)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every condition")
    parser.add_argument("--seconds", type=float, default=8.0, help="per run")
    parser.add_argument(
        "--halt-poll-ns",
        type=lambda text: [int(x) for x in text.split(",")],
        default=[],
        help="values of the guest's halt polling to run each round under (root)",
    )
    args = parser.parse_args(argv)
    placement = Placement.for_engines(1)
    if placement is None:
        parser.error("needs two CPUs or more: the server on one, the rest on the others")
    if args.halt_poll_ns and not HALT_POLL.exists():
        parser.error(f"{HALT_POLL} is missing: this machine has no guest halt polling")
    polls: list[int | None] = list(args.halt_poll_ns) or [None]
    s = replace(Sizes(), model=args.model, saturated_s=args.seconds)
    seeds = itertools.count(1)
    found: dict[str, list[dict[str, Any]]] = {}
    with (
        tempfile.TemporaryDirectory(prefix="llmq-engine-neighbour-") as folder,
        placed(placement),
        start_servers(1, s.write_model(Path(folder)), s, Path(folder), placement) as (server,),
    ):
        url = server_url(server)
        print(f"model {s.model}, server on CPU {placement.engine(0)}, {2 * s.slots} streams")
        for i in range(args.rounds):
            for ns in polls:
                with halt_poll(ns):
                    for name, code in NEIGHBOURS.items():
                        run = _run(url, server.pid, s, code, next(seeds))
                        label = name if ns is None else f"{name}, halt poll {ns} ns"
                        found.setdefault(label, []).append(run)
                        per = run["cpu_ms_per_token"]["llama"]
                        print(
                            f"round {i + 1} {label:34} {run['output_throughput']:7.1f} tok/s, "
                            f"server {per:.3f} CPU ms/token, failed {run['failed']}",
                            flush=True,
                        )
                        for error in run["errors"]:
                            print(f"  failed: {error}")
    for label, runs in found.items():
        tok_s = median_of(runs, "output_throughput")
        per = median_of([r["cpu_ms_per_token"] for r in runs], "llama")
        print(f"median  {label:34} {fmt(tok_s, 1):>7} tok/s, server {fmt(per, 3)} CPU ms/token")


if __name__ == "__main__":
    main()
