"""The upstream benchmark's rounds: every system once per round, in a rotated order,
and throughput judged round by round (a VM's speed drifts over a run)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.scenarios.upstream import SYSTEMS, round_order, shares_by_round
from bench.stats import median


def _runs(*tok_s: float) -> dict[str, Any]:
    return {"runs": {"saturated": [{"output_throughput": x} for x in tok_s]}}


@pytest.mark.timeout(10)
def test_each_round_runs_every_system_once_and_each_takes_every_place_in_turn() -> None:
    orders = [round_order(i) for i in range(len(SYSTEMS))]
    assert all(sorted(order) == sorted(SYSTEMS) for order in orders)
    for place in range(len(SYSTEMS)):
        assert sorted(order[place] for order in orders) == sorted(SYSTEMS)


@pytest.mark.timeout(10)
def test_a_share_compares_the_runs_of_one_round_not_the_medians_of_all() -> None:
    # the VM slowed for the second round, and for llmq's run of the third: the medians
    # (1960 against 3000 tok/s) compare runs of different rounds
    direct = _runs(3000.0, 2000.0, 3100.0)
    llmq = _runs(2940.0, 1960.0, 1800.0)
    shares = shares_by_round(llmq, direct)
    assert shares == pytest.approx([0.98, 0.98, 1800 / 3100])
    assert median(shares) == pytest.approx(0.98)
    assert shares_by_round(_runs(1000.0, 0.0), _runs(2000.0, 0.0)) == [0.5]  # none of a 0
