"""``llmq --version`` says the installed release, the one pyproject.toml and the
changelog's latest release name."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from cli.main import main

ROOT = Path(__file__).resolve().parent.parent


def test_version_prints_the_release_that_pyproject_and_the_changelog_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert capsys.readouterr().out == f"llmq {declared}\n"
    releases = re.findall(
        r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", (ROOT / "CHANGELOG.md").read_text(), re.M
    )
    assert releases and releases[0] == declared


def test_the_changelog_keeps_unreleased_changes_on_top() -> None:
    headings = re.findall(r"^## (.+)$", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert headings[0] == "[Unreleased]"
    assert all(re.fullmatch(r"\[\d+\.\d+\.\d+\] - \d{4}-\d{2}-\d{2}", h) for h in headings[1:])
