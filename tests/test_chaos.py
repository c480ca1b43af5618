"""A 60-second fault campaign with a fixed seed: the checker finds nothing.

The nemesis, clients and checker are those of ``python -m bench --scenarios
chaos`` (docs/chaos.md); a failure names every violation and the command that
replays the seed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.chaos.campaign import Plan, replay_command, run
from tests.support.hosts import require_netns

pytestmark = [pytest.mark.timeout(170), pytest.mark.netns, pytest.mark.slow]

SEED = 26
SECONDS = 60.0


def test_a_minute_of_random_faults_breaks_no_guarantee(tmp_path: Path) -> None:
    require_netns()
    plan = Plan(seed=SEED, duration=SECONDS)
    history, violations = run(plan, print, tmp_path / "chaos")
    assert history.faults, "the nemesis injected nothing"
    assert any(r.outcome == "done" for r in history.requests), "no request finished"
    report = "\n".join(str(v) for v in violations)
    assert not violations, (
        f"seed {SEED}: {len(violations)} violations\n{report}\n"
        f"replay: {replay_command(plan)} (logs and history: {tmp_path / 'chaos'})"
    )
