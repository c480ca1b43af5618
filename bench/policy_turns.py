"""llmq's side of a scenario under several routing policies in turn, on one stack.

``--policies fifo,prefix`` on a scenario that supports it (``light``, ``pickup``)
runs llmq under each routing policy on the same processes: before each run the pool
policy's ``routing`` is set (:mod:`llmq.policy`, as ``llmq config set`` does) and the
run starts once every process has followed it; each repeat takes the policies in the
other order from the last, so that a drift of the machine lands on all of them. What
differs between the runs is then the routing alone, not the processes or the hour,
and the report gives each policy's figures and their paired ratios to the first
policy's. Each policy's run of a repeat draws its own requests (:func:`seed`): with
the same prompts, the second run of a repeat would find them in the engine's prefix
cache from the first and look faster whatever its routing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from redis.asyncio import Redis

from bench.report import fmt, table
from bench.stats import median_of, paired_ratios
from llmq.policy import store
from llmq.policy.live import POLL_SECONDS
from llmq.protocol.routing import POLICIES

#: How long after a policy change a run starts: every process polls the policy's
#: version each ``POLL_SECONDS``; four polls leave them all on the new one.
FOLLOW_SECONDS = 4 * POLL_SECONDS


def routing_policies(policies: Sequence[str]) -> list[str]:
    """The routing policies among a run's ``--policies``."""
    return [p for p in policies if p in POLICIES]


async def _route(redis_url: str, policy: str) -> None:
    redis = Redis.from_url(redis_url)
    try:
        await store.set_values(redis, {"routing": policy}, None, who="bench")
    finally:
        await redis.aclose()
    await asyncio.sleep(FOLLOW_SECONDS)


def seed(repeat: int, turn: int) -> int:
    """The seed of the requests of a repeat's run under its ``turn``-th policy (the
    first policy's is the repeat's own, as the other systems')."""
    return repeat + 1000 * turn


def in_turns(
    redis_url: str, routing: Sequence[str], repeat: int, run: Callable[[int], dict[str, Any]]
) -> dict[str, Any]:
    """One repeat's runs, one per routing policy (reversed on odd repeats), each
    ``run(seed)``: the first policy's figures, with every policy's under ``"routing"``."""
    each: dict[str, Any] = {}
    for policy in routing if repeat % 2 == 0 else list(reversed(routing)):
        asyncio.run(_route(redis_url, policy))
        each[policy] = run(seed(repeat, routing.index(policy)))
    return {**each[routing[0]], "routing": each}


def by_policy(
    runs: Sequence[dict[str, Any]], routing: Sequence[str], labels: dict[str, str]
) -> dict[str, Any]:
    """Each policy's medians of ``labels``' keys over the runs made by :func:`in_turns`,
    and each policy's paired ratios to the first's: markdown and data."""
    per = {p: [r["routing"][p] for r in runs] for p in routing}
    medians = {p: {k: median_of(rs, k) for k in labels} for p, rs in per.items()}
    ratios = {p: {k: paired_ratios(per[p], per[routing[0]], k) for k in labels} for p in routing}
    rows = []
    for k, label in labels.items():
        row = [label] + [fmt(medians[p][k], 2) for p in routing]
        for p in routing[1:]:
            r = ratios[p][k]
            row.append(f"{fmt(r['median'], 2)} ({', '.join(fmt(x, 2) for x in r['each'])})")
        rows.append(row)
    head = ["llmq", *(f"`{p}`" for p in routing), *(f"`{p}` / `{routing[0]}`" for p in routing[1:])]
    md = "\n\n".join(
        [
            "llmq under each routing policy in turn, on the same processes (the order "
            "reversed every other repeat): medians of the runs' figures; ratio: the median "
            "of the per-repeat ratios (each in brackets).",
            table(head, rows),
        ]
    )
    return {"md": md, "data": {"medians": medians, "ratios": {p: ratios[p] for p in routing[1:]}}}
