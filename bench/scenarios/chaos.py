"""Chaos: a randomized fault campaign on the many-host cluster, judged whole.

``python -m bench --scenarios chaos [--seed S] [--duration SECONDS]`` runs
:mod:`bench.chaos.campaign`: clients and the nemesis for ``duration`` seconds
(default 300, 60 with ``--quick``), then the checker over the whole history. The
figures: faults by kind, requests by kind and outcome, stalls, reconnects, tokens
generated after a lease was lost, and every violation with the command that
replays the seed (docs/chaos.md).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.chaos.checker import Violation
from bench.chaos.history import History
from bench.report import fmt, table
from bench.scenario import Context, ScenarioResult, Target
from bench.stats import describe_ms

DEFAULT_SEED = 1
DEFAULT_SECONDS = 300.0
QUICK_SECONDS = 60.0


if TYPE_CHECKING:
    from bench.chaos.campaign import Plan


def plan_for(ctx: Context) -> Plan:
    from bench.chaos.campaign import Plan

    duration = ctx.duration or (QUICK_SECONDS if ctx.quick else DEFAULT_SECONDS)
    return Plan(seed=DEFAULT_SEED if ctx.seed is None else ctx.seed, duration=duration)


def run(ctx: Context) -> ScenarioResult:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        note = "skipped: network namespaces need root and iproute2"
        return ScenarioResult("chaos", "Fault campaign", {"skipped": note}, note, [])
    # here, not at the top: the campaign uses other scenarios' helpers (host_faults)
    from bench.chaos.campaign import replay_command
    from bench.chaos.campaign import run as run_campaign

    plan = plan_for(ctx)
    kept = Path(tempfile.gettempdir()) / f"llmq-chaos-{plan.seed}-{os.getpid()}"
    history, violations = run_campaign(plan, ctx.say, kept)
    data = summary(history, violations, plan)
    for v in violations[:20]:
        ctx.say(f"chaos: {v}")
    if violations:
        ctx.say(f"chaos: {len(violations)} violations; replay: {replay_command(plan)}")
    detail = "none" if not violations else f"{len(violations)}; replay: `{replay_command(plan)}`"
    targets = [
        Target("the checker finds no violation in the whole history", not violations, detail)
    ]
    return ScenarioResult("chaos", "Fault campaign", data, markdown(data), targets)


def summary(history: History, violations: list[Violation], plan: Plan) -> dict[str, Any]:
    """The campaign's figures, for the JSON and the markdown."""
    from bench.chaos.campaign import replay_command

    accepted = [r for r in history.requests if r.request_id is not None]
    stalls = [r.stall * 1000 for r in accepted if r.outcome == "done"]
    return {
        "seed": plan.seed,
        "duration_s": plan.duration,
        "replay": replay_command(plan),
        "faults": dict(Counter(f.kind for f in history.faults)),
        "fault_count": len(history.faults),
        "quiet_at_s": history.quiet_at,
        "requests": dict(Counter(r.spec.kind for r in history.requests)),
        "cancelling": sum(r.spec.cancel_after is not None for r in history.requests),
        "outcomes": {
            kind: dict(Counter(str(r.outcome) for r in history.requests if r.spec.kind == kind))
            for kind in ("native", "openai")
        },
        "tenants": {
            tenant: dict(
                Counter(str(r.outcome) for r in history.requests if r.spec.tenant == tenant)
            )
            for tenant in sorted({r.spec.tenant for r in history.requests})
        },
        "batches": len(history.batches),
        "batch_lines": sum(len(b.specs) for b in history.batches),
        "tenant_tokens": history.tenant_tokens,
        "wait_bound_s": history.wait_bound,
        "statuses": dict(Counter(r.record.get("status", "—") for r in accepted)),
        "settled_after_max_s": max((r.settled_after or 0.0 for r in accepted), default=0.0),
        "stall_ms": describe_ms(stalls),
        "reconnects": sum(r.reconnects for r in history.requests),
        "lease_lost_tokens": history.lease_lost_tokens,
        "counters": history.counters,
        "left": {"queued": history.queued, "running": history.running},
        "process_exits": sum(p.exit_code is not None for p in history.processes),
        "violations": [str(v) for v in violations],
    }


def markdown(d: dict[str, Any]) -> str:
    stall = d["stall_ms"]
    lines = [
        f"Seed {d['seed']}, {d['duration_s']:g} s of faults (healed at {d['quiet_at_s']:.0f} s); "
        f"replay: `{d['replay']}`.",
        "",
        table(["fault", "count"], [[k, str(v)] for k, v in sorted(d["faults"].items())]),
        "",
        table(
            ["client", "requests", "outcomes (as the client saw them)"],
            [
                [kind, str(d["requests"].get(kind, 0)), _counts(d["outcomes"][kind])]
                for kind in ("native", "openai")
            ],
        ),
        "",
        table(
            ["tenant", "outcomes (as the client saw them)", "tokens counted"],
            [
                [tenant, _counts(outcomes), f"{d['tenant_tokens'].get(tenant or 'default', 0):g}"]
                for tenant, outcomes in d["tenants"].items()
            ],
        ),
        "",
        f"{d['batches']} batches ({d['batch_lines']} lines) ran one after another. Bound on "
        f"the first token of a tenant below its share: {d['wait_bound_s']:g} s.",
        "",
        f"Records at the end: {_counts(d['statuses'])}; the last ended "
        f"{d['settled_after_max_s']:.1f} s after the faults stopped. {d['cancelling']} clients "
        f"cancelled at a random moment; native clients reconnected {d['reconnects']} times. "
        f"Longest stall per finished stream (ms): median {fmt(stall['median'], 0)}, p99 "
        f"{fmt(stall['p99'], 0)}, max {fmt(stall['max'], 0)}. Tokens generated after a lease "
        f"was lost: {d['lease_lost_tokens']:g}. Left queued/running: {d['left']['queued']}/"
        f"{d['left']['running']}; processes that exited: {d['process_exits']} (all by the "
        "nemesis unless listed below).",
        "",
        "Violations: " + ("none." if not d["violations"] else ""),
        *[f"- {v}" for v in d["violations"][:50]],
    ]
    return "\n".join(lines)


def _counts(counter: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counter.items())) or "—"
