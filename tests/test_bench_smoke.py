"""The benchmark suite runs end to end at tiny sizes and writes its figures."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.engine]

ROOT = Path(__file__).resolve().parent.parent


def _run(argv: list[str | Path], timeout: float) -> subprocess.CompletedProcess[str]:
    """``python`` with ``argv`` from the checkout's root; it must exit 0."""
    done = subprocess.run(
        [sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.mark.timeout(120)
def test_bench_quick_light_pickup_and_recovery(tmp_path: Path) -> None:
    done = _run(
        [
            "-m",
            "bench",
            "--quick",
            "--scenarios",
            "light,pickup,recovery",
            "--repeats",
            "1",
            "--out",
            str(tmp_path),
        ],
        timeout=90,
    )
    [json_path] = tmp_path.glob("*.json")
    md_path = json_path.with_suffix(".md")
    assert md_path.exists() and (tmp_path / "latest.md").read_text() == md_path.read_text()

    results = json.loads(json_path.read_text())
    assert results["machine"]["cpu_count"] >= 1 and results["machine"]["redis_version"]
    light = results["scenarios"]["light"]["medians"]
    for system in ("llmq", "baseline"):
        assert light[system]["ttft_ms_median"] > 0
        assert light[system]["e2el_ms_p99"] > 0
    pickup = results["scenarios"]["pickup"]["medians"]
    for system in ("llmq", "stock_arq", "redis_hop"):
        assert pickup[system]["wait_ms_median"] >= 0

    recovery = results["scenarios"]["recovery"]
    assert recovery["incorrect_streams"] == 0
    assert 0 < recovery["summary"]["restart_s"]["median"] < recovery["summary"]["stall_s"]["max"]

    markdown = md_path.read_text()
    assert "## light" in markdown and "## pickup" in markdown and "## recovery" in markdown
    assert "TTFT median (ms)" in markdown and "stock arq" in markdown
    assert done.stdout.strip().startswith("# llmq benchmark")


@pytest.mark.timeout(150)
def test_bench_quick_light_and_pickup_run_llmq_under_routing_policies_in_turn(
    tmp_path: Path,
) -> None:
    argv = ["-m", "bench", "--quick", "--scenarios", "light,pickup", "--policies", "fifo,prefix"]
    _run([*argv, "--repeats", "2", "--out", tmp_path], timeout=140)
    [json_path] = tmp_path.glob("*.json")
    scenarios = json.loads(json_path.read_text())["scenarios"]
    for name, key in (("light", "ttft_ms_median"), ("pickup", "wait_ms_median")):
        for run in scenarios[name]["runs"]["llmq"]:
            assert set(run["routing"]) == {"fifo", "prefix"}
            assert run[key] == run["routing"]["fifo"][key]
        each = scenarios[name]["by_policy"]["ratios"]["prefix"][key]["each"]
        assert len(each) == 2 and all(r > 0 for r in each), name
    assert json_path.with_suffix(".md").read_text().count("`prefix` / `fifo`") == 2


@pytest.mark.timeout(90)
def test_bench_quick_capacity_measures_the_floors_and_llmq(tmp_path: Path) -> None:
    _run(
        [
            "-m",
            "bench",
            "--quick",
            "--scenarios",
            "capacity",
            "--systems",
            "floor,floor-redis,floor-redis-2p,llmq",
            "--levels",
            "10",
            "--repeats",
            "1",
            "--out",
            str(tmp_path),
        ],
        timeout=80,
    )
    [json_path] = tmp_path.glob("*.json")
    capacity = json.loads(json_path.read_text())["scenarios"]["capacity"]
    hop, apart = "floor via Redis", "floor via Redis (model apart)"
    assert set(capacity["held"]) == {"floor", hop, apart, "llmq"}
    assert all(len(levels) == 1 for levels in capacity["levels"].values())
    first = {name: levels[0] for name, levels in capacity["levels"].items()}
    assert {level["users"] for level in first.values()} == {10}
    for name, level in first.items():
        assert level["failed"] == 0, (name, level["errors"])
        assert level["output_throughput"] > 0
    assert set(first["floor"]["cpu_ms_per_token"]) == {"floor", "loadgen"}
    assert set(first[hop]["cpu_ms_per_token"]) == {"floor", "redis", "loadgen"}
    assert set(first[apart]["cpu_ms_per_token"]) == {"floor", "model", "redis", "loadgen"}
    assert set(first["llmq"]["cpu_ms_per_token"]) == {"api", "workers", "redis", "loadgen"}
    for name in (hop, apart, "llmq"):
        assert all(v > 0 for v in first[name]["cpu_ms_per_token"].values()), name
    markdown = json_path.with_suffix(".md").read_text()
    assert "share of the floor via Redis" in markdown and "**floor**" in markdown
    assert f"**{hop}**" in markdown and f"**{apart}**" in markdown


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    ("name", "model", "width"),
    [("upstream-ttft", "tiny", 128), ("upstream-small-ttft", "small", 512)],
)
def test_bench_quick_upstream_ttft_times_direct_floor_and_llmq_in_turn_in_both_placements(
    tmp_path: Path, name: str, model: str, width: int
) -> None:
    _run(["-m", "bench", "--quick", "--scenarios", name, "--out", tmp_path], timeout=120)
    [json_path] = tmp_path.glob("*.json")
    scenario = json.loads(json_path.read_text())["scenarios"][name]
    assert scenario["settings"]["model"] == model
    pinned = scenario["placement"] is not None  # two CPUs or more
    assert set(scenario["paired"]) == (
        {"shared CPUs", "engine pinned"} if pinned else {"shared CPUs"}
    )
    for paired in scenario["paired"].values():
        assert paired["failed"] == 0 and paired["rounds"] == 20
        assert paired["served"]["n_embd"] == width  # as the server itself reports
        alone = paired["servers"]  # each system's server straight from the client
        assert alone["failed"] == 0 and alone["rounds"] == 10
        assert set(alone["difference_ms_median"]) == set(paired["difference_ms_median"])
        medians = paired["ttft_ms_median"]
        assert set(medians) == {"direct", "relay floor", "llmq"}
        assert all(v > 0 for v in medians.values())
        assert set(paired["difference_ms_median"]) == {
            "relay floor - direct",
            "llmq - direct",
            "llmq - relay floor",
        }
    markdown = json_path.with_suffix(".md").read_text()
    assert f"({model} random model: " in markdown and f"width {width}, " in markdown
    for where in scenario["paired"]:
        assert f"**{where}**: Requests in turn" in markdown
        assert "Each system's server alone, in turn, 10 rounds after" in markdown
        assert f"{where}, requests in turn: median TTFT through llmq <= 1.05x direct" in markdown


@pytest.mark.timeout(300)
def test_bench_quick_upstream_runs_every_system_and_judges_throughput_by_round(
    tmp_path: Path,
) -> None:
    done = _run(["-m", "bench", "--quick", "--scenarios", "upstream", "--out", tmp_path], 270)
    [json_path] = tmp_path.glob("*.json")
    scenario = json.loads(json_path.read_text())["scenarios"]["upstream"]
    assert set(scenario["systems"]) == (
        {"shared CPUs", "engine pinned"} if scenario["placement"] else {"shared CPUs"}
    )
    for where, systems in scenario["systems"].items():
        direct = systems["direct"]
        assert set(direct["cpu_ms_per_token"]) == {"llama", "loadgen"}
        for name in ("direct", "llmq", "llmq-2", "llmq-queued", "relay floor"):
            runs = systems[name]["runs"]
            assert len(runs["light"]) == len(runs["saturated"]) == 1, (where, name)
            assert systems[name]["failed"] == 0, (where, name, runs["saturated"][0]["errors"])
        for name in ("llmq", "llmq-2", "llmq-queued", "relay floor"):
            assert set(systems[name]["cpu_ms_per_token"]) >= {"api", "workers", "redis"}
            [share] = systems[name]["throughput_shares"]
            tok_s = systems[name]["output_throughput"]
            assert share == pytest.approx(tok_s / direct["output_throughput"])
    for system in ("direct", "llmq, 1 worker + 1 server", "relay floor, 1 server"):
        assert f"  {system}: round 1/1" in done.stderr + done.stdout
    markdown = json_path.with_suffix(".md").read_text()
    shares = r"Throughput at saturation, share of direct's .*?relay floor, 1 server \d+\.\d %"
    assert len(re.findall(shares, markdown)) == len(scenario["systems"])
    drift = r"The servers' CPU per token at saturation, run by run \(ms; .*?\): direct \d\.\d{3}-"
    assert len(re.findall(drift, markdown)) == len(scenario["systems"])
    for where in scenario["systems"]:
        for how in ("cap = slots", "LLMQ_UPSTREAM_QUEUE=4"):
            target = f"{where}, {how}: throughput at saturation >= 95% of direct (median of the"
            assert target in markdown


@pytest.mark.timeout(60)
def test_paired_ttft_times_each_system_once_per_round() -> None:
    from bench.paired import paired_ttft
    from loadgen import LoadConfig
    from rigs.llama import tiny_server

    with tiny_server(1) as first, tiny_server(1) as second:
        config = LoadConfig(
            base_url=first, model="tiny", prompt_tokens=(8, 8), output_tokens=(4, 4), seed=3
        )
        out = paired_ttft({"a": first, "b": second}, config, rounds=4)
    assert out["failed"] == 0 and out["rounds"] == 4
    a, b = out["ttft_ms"]["a"], out["ttft_ms"]["b"]
    assert len(a) == len(b) == 4 and all(v > 0 for v in a + b)
    differences = sorted(y - x for x, y in zip(a, b, strict=True))
    assert out["difference_ms_median"] == {
        "b - a": pytest.approx((differences[1] + differences[2]) / 2)
    }
