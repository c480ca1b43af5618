"""The ``llmq loadgen`` front: flags to settings, exit codes, and the files it writes."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

from loadgen.cli import add_arguments, config_from_args, main


def _parse(command: str = "") -> argparse.Namespace:
    """Parse a whitespace-separated command line (no quoting needed in these tests)."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(command.split())


def test_flags_become_settings() -> None:
    config = config_from_args(
        _parse(
            "--base-url http://h:1 --endpoint chat --model m --api-key k --ramp-up 1:20"
            " --burstiness 0.5 --max-concurrency 7 --duration 30 --warmup 3"
            " --prompt-tokens 50:200 --output-tokens 64 --priority-mix 0:0.2,5:0.8 --seed 9"
            " --goodput ttft:500 e2el:4000 --percentiles 50,99.9 --timeout 5 --no-progress"
        )
    )
    assert (config.base_url, config.endpoint, config.model, config.api_key) == (
        "http://h:1",
        "chat",
        "m",
        "k",
    )
    assert config.ramp_up == (1.0, 20.0) and math.isinf(config.request_rate)
    assert (config.burstiness, config.max_concurrency, config.duration) == (0.5, 7, 30.0)
    assert config.request_limit is None and config.warmup == 3
    assert config.prompt_tokens == (50, 200) and config.output_tokens == (64, 64)
    assert config.priority_mix == ((0, 0.2), (5, 0.8)) and config.seed == 9
    assert config.goodput == {"ttft": 500.0, "e2el": 4000.0}
    assert config.percentiles == (50.0, 99.9) and config.timeout == 5.0
    assert config.progress is False and config.in_process is False


def test_defaults() -> None:
    config = config_from_args(_parse())
    assert config.base_url == "http://127.0.0.1:8000" and config.endpoint == "completions"
    assert config.model == "mock" and config.request_limit == 100 and config.progress


def test_malformed_flag_is_a_usage_error() -> None:
    with pytest.raises(SystemExit):
        _parse("--prompt-tokens a:b")


def test_contradictory_flags_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_parse("--concurrency 4 --request-rate 3 --no-progress")) == 2
    assert "closed loop" in capsys.readouterr().err


def test_missing_dataset_exits_2(tmp_path: Path) -> None:
    args = _parse(f"--in-process --dataset {tmp_path / 'none.jsonl'} --no-progress")
    assert main(args) == 2


def test_in_process_run_writes_summary_json_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _parse(
        "--in-process --num-requests 12 --request-rate 200 --seed 1 --prompt-tokens 5:20"
        " --output-tokens 3:6 --priority-mix 0:1,4:1 --tokens-per-second 400"
        f" --goodput ttft:1000 --warmup 2 --output {tmp_path / 'r.json'}"
        f" --plots {tmp_path / 'plots'}"
    )
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "============ Serving Benchmark Result ============" in out
    assert "Successful requests:                     12" in out
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["lagged"] is False and data["target"] == "in_process"
    assert len(data["requests"]) == 12 and len(data["warmup_requests"]) == 2
    assert data["settings"]["in_process"] is True and data["settings"]["seed"] == 1
    assert data["summary"]["good_requests"] == 12
    pngs = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert pngs == [
        "latency_cdf.png",
        "throughput_over_time.png",
        "ttft_by_priority.png",
        "ttft_over_time.png",
    ]
    assert all((tmp_path / "plots" / name).read_bytes()[:4] == b"\x89PNG" for name in pngs)


def test_all_failed_exits_1() -> None:
    args = _parse(
        "--in-process --num-requests 2 --tokens-per-second 2 --timeout 0.05 --no-progress"
    )
    assert main(args) == 1
