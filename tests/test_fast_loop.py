"""The fast loop: ``make check`` leaves out exactly the tests that need what a
contributor's machine may lack (an inference server, Docker, root, a browser) or a
long run,
each module that needs one is marked for it, and pre-commit runs ``make lint``'s
commands."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent

#: What a test module's text shows it needs, by the marker that says so.
NEEDS = {
    "engine": re.compile(r"\btiny_server\(|\bvllm_server\b|\bLlamaServer\b|\bwrite_tiny_gguf\b"),
    "docker": re.compile(r"\bCompose\b"),
    "netns": re.compile(r"\brequire_netns\b|\bcluster_stack\b|\brigs\.(netns|hosts)\b"),
    "trace_backend": re.compile(r"\bphoenix: Phoenix\b"),
    "browser": re.compile(r"\bplaywright\b"),
}


def registered() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    return [line.split(":")[0] for line in config["ini_options"]["markers"]]


def test_make_check_leaves_out_every_registered_marker_and_nothing_else() -> None:
    (fast,) = re.findall(r"^FAST := (.+)$", (ROOT / "Makefile").read_text(), re.M)
    assert fast == " and ".join(f"not {marker}" for marker in registered())
    assert '$(BIN)/pytest -q -n 2 -m "$(FAST)"' in (ROOT / "Makefile").read_text()


@pytest.mark.parametrize("marker", sorted(NEEDS))
def test_a_module_that_needs_it_is_marked_for_it(marker: str) -> None:
    assert marker in registered()
    modules = sorted((ROOT / "tests").rglob("test_*.py"))
    needing = [m for m in modules if NEEDS[marker].search(m.read_text())]
    assert needing, f"nothing found that needs {marker}: is the pattern stale?"
    unmarked = [m.name for m in needing if f"pytest.mark.{marker}" not in m.read_text()]
    assert not unmarked, f"these need {marker} but are not marked for it: {unmarked}"


def test_pre_commit_runs_the_lint_of_make_lint() -> None:
    lint = re.search(r"^lint: install\n((?:\t.+\n)+)", (ROOT / "Makefile").read_text(), re.M)
    assert lint is not None
    commands = [line.strip().removeprefix("$(BIN)/") for line in lint.group(1).splitlines()]
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    hooks = [hook for repo in config["repos"] for hook in repo["hooks"]]
    entries = [
        hook["entry"].removeprefix(".venv/bin/").removesuffix(" --force-exclude") for hook in hooks
    ]
    assert entries == [c.removesuffix(" .") for c in commands]
