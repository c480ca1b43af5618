"""Benchmark results go where the user asks, outside the checkout by default; the
repository keeps only the named result per scenario that the docs cite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import report
from bench.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent


def test_results_go_to_llmqs_cache_outside_the_checkout(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("LLMQ_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert report.results_dir() == tmp_path / ".cache" / "llmq" / "bench-results"
    monkeypatch.setenv("LLMQ_CACHE", str(tmp_path / "cache"))
    assert report.results_dir() == tmp_path / "cache" / "bench-results"
    assert build_parser().parse_args([]).out is None  # main() then asks results_dir()


def test_a_run_is_named_by_its_timestamp_with_a_latest_copy_or_by_its_name(
    tmp_path: Path,
) -> None:
    stamped = report.write(tmp_path / "a", "20261204T000000Z", {"x": 1}, "# a\n")
    assert [p.name for p in stamped] == [
        "20261204T000000Z.json",
        "20261204T000000Z.md",
        "latest.md",
    ]
    assert (tmp_path / "a" / "latest.md").read_text() == "# a\n"
    named = report.write(tmp_path / "b", "20261204T000000Z", {"x": 1}, "# b\n", "upstream")
    assert [p.name for p in named] == ["upstream.json", "upstream.md"]
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["upstream.json", "upstream.md"]
    assert json.loads(named[0].read_text()) == {"x": 1}


def test_the_checkout_keeps_one_named_result_per_scenario_and_no_run_log() -> None:
    kept = sorted(p.name for p in (ROOT / "bench" / "results").iterdir())
    stems = {name.rsplit(".", 1)[0] for name in kept}
    assert kept == sorted(f"{stem}.{ext}" for stem in stems for ext in ("json", "md"))
    assert not [name for name in kept if name[0].isdigit() or name == "latest.md"]


def test_every_kept_result_is_one_that_a_doc_cites() -> None:
    cited = "".join(page.read_text() for page in (ROOT / "docs").glob("*.md"))
    for result in (ROOT / "bench" / "results").glob("*.md"):
        assert f"bench/results/{result.name}" in cited, f"no doc cites {result.name}"
