"""The scenarios, in the order a full run executes them (cheap and informative first)."""

from __future__ import annotations

from collections.abc import Callable

from bench.scenario import Context, ScenarioResult
from bench.scenarios import (
    autoscale,
    batch,
    capacity,
    chaos,
    choices,
    cluster,
    fairness,
    light,
    multihost,
    overload,
    pickup,
    recovery,
    redis_faults,
    routing,
    scaling,
    upstream,
)

SCENARIOS: dict[str, Callable[[Context], ScenarioResult]] = {
    "light": light.run,
    "pickup": pickup.run,
    "scaling": scaling.run,
    "overload": overload.run,
    "capacity": capacity.run,
    "recovery": recovery.run,
    "redis-faults": redis_faults.run,
    "multihost": multihost.run,
    "choices": choices.run,
    "autoscale": autoscale.run,
}

#: Scenarios run only when named in ``--scenarios``: parts of a default one, alone.
ON_REQUEST: dict[str, Callable[[Context], ScenarioResult]] = {
    "multihost-failovers": multihost.run_failovers,
    "cluster": cluster.run,
    "upstream": upstream.run,
    "upstream-ttft": upstream.run_ttft,
    "upstream-small": upstream.run_small,
    "upstream-small-ttft": upstream.run_small_ttft,
    "routing": routing.run,
    "chaos": chaos.run,
    "fairness": fairness.run,
    "batch": batch.run,
}
