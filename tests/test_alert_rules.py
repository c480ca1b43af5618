"""The Prometheus rules (deploy/prometheus/rules/) are valid and pass their unit tests.

``promtool`` (Debian's prometheus package; scripts/system-deps.sh installs it) checks
the rules and the compose stack's Prometheus config that loads them, and runs the
unit tests of deploy/prometheus/tests/, where each alert fires on the series that
should fire it and stays silent on one that should not. Without promtool these tests
skip, except under CI=true, where they fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

PROMETHEUS = Path(__file__).resolve().parent.parent / "deploy" / "prometheus"
RULES = sorted((PROMETHEUS / "rules").glob("*.yml"))
UNIT_TESTS = sorted((PROMETHEUS / "tests").glob("*.test.yml"))


def promtool(*args: str) -> str:
    """promtool's output; the test fails if it exits non-zero."""
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool is missing under CI (scripts/system-deps.sh installs it)")
        pytest.skip("promtool is not installed (Debian package prometheus)")
    done = subprocess.run(
        [found, *args], capture_output=True, text=True, timeout=60, cwd=PROMETHEUS, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    return output


def test_the_rules_and_the_config_that_loads_them_are_valid() -> None:
    assert RULES
    promtool("check", "rules", *map(str, RULES))
    assert f"{len(RULES)} rule files found" in promtool("check", "config", "prometheus.yml")


@pytest.mark.parametrize("unit_tests", UNIT_TESTS, ids=lambda p: p.name)
def test_the_rules_pass_their_unit_tests(unit_tests: Path) -> None:
    assert "SUCCESS" in promtool("test", "rules", str(unit_tests))


def test_every_alert_has_a_unit_test_it_fires_in() -> None:
    alerts = {
        rule["alert"]
        for path in RULES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }
    fired = {
        case["alertname"]
        for path in UNIT_TESTS
        for test in yaml.safe_load(path.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert alerts and alerts == fired, sorted(alerts ^ fired)
