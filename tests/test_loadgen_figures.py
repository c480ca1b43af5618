"""Figures from measurements: percentiles, goodput, throughput, failures, lag, report and JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from loadgen.config import (
    LoadConfig,
    parse_goodput,
    parse_pair,
    parse_percentiles,
    parse_priority_mix,
    parse_range,
)
from loadgen.figures import describe, meets_slos, peak_in_flight, percentile, summarize
from loadgen.measurements import RequestFailed, RequestMeasurement, StreamClock
from loadgen.report import format_summary, write_json
from loadgen.result import RunResult


def _ok(
    index: int,
    *,
    ttft: float,
    tpot: float | None = 0.01,
    e2e: float = 1.0,
    tokens: int = 10,
    lag: float = 0.0,
    priority: int | None = None,
) -> RequestMeasurement:
    return RequestMeasurement(
        index=index,
        priority=priority,
        prompt_tokens=5,
        max_tokens=tokens,
        sent_s=float(index),
        end_s=index + e2e,
        lag_s=lag,
        output_tokens=tokens,
        ttft_s=ttft,
        itl_s=[0.01] * (tokens - 1),
        tpot_s=tpot,
        e2e_s=e2e,
    )


def _failed(index: int, kind: str) -> RequestMeasurement:
    measurement = RequestMeasurement(index=index, priority=None, prompt_tokens=5, max_tokens=10)
    measurement.failure = kind  # type: ignore[assignment]
    measurement.error = "x"
    return measurement


def test_percentiles_interpolate_linearly() -> None:
    data = [float(x) for x in range(1, 11)]
    assert percentile(data, 50) == pytest.approx(5.5)
    assert percentile(data, 90) == pytest.approx(9.1)
    assert percentile(data, 99) == pytest.approx(9.91)
    assert percentile(data, 25) == pytest.approx(3.25)
    assert percentile([7.0], 99) == 7.0
    assert percentile([10.0, 0.0, 20.0, 30.0], 75) == pytest.approx(22.5)  # order-free


def test_describe_converts_to_ms_and_handles_empty() -> None:
    stats = describe([0.001, 0.002, 0.003, 0.004], [50, 99, 99.9])
    assert stats["mean"] == pytest.approx(2.5)
    assert stats["median"] == pytest.approx(2.5)
    assert stats["std"] == pytest.approx(math.sqrt(1.25))
    assert stats["p99"] == pytest.approx(3.97)
    assert stats["p99_9"] == pytest.approx(3.997)
    assert stats["max"] == pytest.approx(4.0)
    assert all(v is None for v in describe([], [99]).values())


def test_goodput_counts_requests_meeting_every_slo() -> None:
    slos = {"ttft": 100.0, "tpot": 20.0, "e2el": 2000.0}
    good = _ok(0, ttft=0.05, tpot=0.015, e2e=1.5)
    slow_first = _ok(1, ttft=0.2)
    slow_decode = _ok(2, ttft=0.05, tpot=0.03)
    slow_total = _ok(3, ttft=0.05, e2e=2.5)
    one_token = _ok(4, ttft=0.05, tpot=None, tokens=1)  # no TPOT: that SLO cannot fail
    exactly = _ok(5, ttft=0.1, tpot=0.02, e2e=2.0)  # limits are inclusive
    failed = _failed(6, "http_5xx")
    measurements = [good, slow_first, slow_decode, slow_total, one_token, exactly, failed]
    assert [meets_slos(r, slos) for r in measurements] == [1, 0, 0, 0, 1, 1, 0]
    summary = summarize(measurements, duration_s=2.0, slos_ms=slos)
    assert summary["good_requests"] == 3
    assert summary["goodput"] == pytest.approx(1.5)
    assert summarize(measurements, duration_s=2.0)["goodput"] is None
    assert summarize(measurements, duration_s=2.0, slos_ms={"ttft": 150.0})["good_requests"] == 5


def test_summary_throughput_failures_and_latency_keys() -> None:
    measurements = [_ok(i, ttft=0.01 * (i + 1), tokens=10) for i in range(10)]
    measurements += [_failed(10, "http_429"), _failed(11, "http_429"), _failed(12, "timeout")]
    s = summarize(measurements, duration_s=4.0, percentiles=(50, 90, 99))
    assert (s["requests"], s["completed"], s["failed"]) == (13, 10, 3)
    assert s["failures"]["http_429"] == 2 and s["failures"]["timeout"] == 1
    assert s["failures"]["connection"] == 0
    assert s["request_throughput"] == pytest.approx(2.5)
    assert s["output_throughput"] == pytest.approx(25.0)
    assert s["total_token_throughput"] == pytest.approx((50 + 100) / 4)
    assert s["ttft_ms_median"] == pytest.approx(55.0)
    assert s["ttft_ms_p90"] == pytest.approx(91.0)
    assert s["ttft_ms_p99"] == pytest.approx(99.1)
    assert s["itl_ms_mean"] == pytest.approx(10.0)
    assert s["e2el_ms_p50"] == pytest.approx(1000.0)
    assert s["tpot_ms_max"] == pytest.approx(10.0)


def test_lag_flag_follows_the_p99_threshold() -> None:
    calm = [_ok(i, ttft=0.01, lag=0.001) for i in range(100)]
    assert summarize(calm, duration_s=1.0)["lagged"] is False
    late = [_ok(i, ttft=0.01, lag=0.001 if i < 95 else 0.05) for i in range(100)]
    s = summarize(late, duration_s=1.0)
    assert s["lagged"] is True and s["lag_ms_p99"] > 10.0
    assert summarize(late, duration_s=1.0, lag_threshold_ms=100.0)["lagged"] is False


def test_peak_in_flight_and_priority_breakdown() -> None:
    measurements = [_ok(0, ttft=0.1, e2e=3.0, priority=0), _ok(1, ttft=0.2, e2e=0.5, priority=5)]
    measurements.append(_ok(3, ttft=0.3, e2e=1.0, priority=0))  # starts when 0 ends at 3.0
    assert peak_in_flight(measurements) == 2
    by = summarize(measurements, duration_s=4.0)["by_priority"]
    assert list(by) == ["0", "5"]
    assert by["0"]["completed"] == 2 and by["0"]["ttft_ms_median"] == pytest.approx(200.0)


def test_stream_clock_follows_vllm_definitions() -> None:
    clock = StreamClock()
    clock.sent_at = 100.0
    clock.chunk_at = [100.2, 100.25, 100.35]
    clock.usage(5)  # e.g. coalesced chunks: 5 tokens in 3 chunks
    measurement = RequestMeasurement(index=0, priority=None, prompt_tokens=3, max_tokens=5)
    measurement.scheduled_s = 0.5
    clock.fill(measurement, run_start=99.0, ended_at=100.6, failure=None)
    assert measurement.sent_s == pytest.approx(1.0) and measurement.end_s == pytest.approx(1.6)
    assert measurement.ttft_s == pytest.approx(0.2)
    assert measurement.itl_s == pytest.approx([0.05, 0.1])
    assert measurement.e2e_s == pytest.approx(0.6)
    assert measurement.output_tokens == 5
    assert measurement.tpot_s == pytest.approx((0.6 - 0.2) / 4)
    assert measurement.chunk_times() == pytest.approx([1.2, 1.25, 1.35])

    no_usage = StreamClock()
    no_usage.sent_at, no_usage.chunk_at = 0.0, [0.1, 0.2]
    bad = RequestMeasurement(index=1, priority=None, prompt_tokens=3, max_tokens=5)
    no_usage.fill(bad, run_start=0.0, ended_at=0.3, failure=RequestFailed("connection", "cut"))
    assert (bad.failure, bad.error, bad.output_tokens) == ("connection", "cut", 2)
    assert bad.e2e_s is None and bad.tpot_s is None and not bad.ok


def _result(measurements: list[RequestMeasurement], **overrides: object) -> RunResult:
    config = LoadConfig(num_requests=len(measurements), **overrides)  # type: ignore[arg-type]
    return RunResult(config, measurements, duration_s=10.0, started_at=0.0, target="http")


def test_summary_table_has_the_vllm_layout() -> None:
    measurements = [_ok(i, ttft=0.01 * (i + 1)) for i in range(10)] + [_failed(10, "server_error")]
    text = format_summary(_result(measurements, goodput={"ttft": 50.0}, max_concurrency=4))
    lines = text.splitlines()
    assert lines[0] == "============ Serving Benchmark Result ============"
    assert "---------------Time to First Token----------------" in lines
    assert "-----Time per Output Token (excl. 1st token)------" in lines
    assert lines[-1] == "=" * 50
    for label in [
        "Successful requests:",
        "Benchmark duration (s):",
        "Request throughput (req/s):",
        "Request goodput (req/s):",
        "Mean TTFT (ms):",
        "Median TTFT (ms):",
        "P99 TTFT (ms):",
        "Mean E2EL (ms):",
        "server_error:",
        "Maximum request concurrency:",
    ]:
        assert any(line.startswith(label) for line in lines), label
    assert "Successful requests:                     10" in lines
    assert "WARNING" not in text


def test_lagged_run_warns_and_marks_the_json(tmp_path: Path) -> None:
    measurements = [_ok(i, ttft=0.01, lag=0.03) for i in range(20)]
    result = _result(measurements)
    assert "WARNING: the load generator lagged" in format_summary(result)
    data = json.loads(write_json(result, tmp_path / "out" / "r.json").read_text())
    assert data["lagged"] is True and data["summary"]["lagged"] is True
    assert data["settings"]["request_rate"] == "inf"
    assert len(data["requests"]) == 20
    first = data["requests"][0]
    for key in (
        "index",
        "scheduled_s",
        "sent_s",
        "lag_s",
        "priority",
        "prompt_tokens",
        "max_tokens",
        "output_tokens",
        "ttft_s",
        "itl_s",
        "tpot_s",
        "e2e_s",
        "status",
        "failure",
        "error",
    ):
        assert key in first


def test_parsers_and_validation() -> None:
    assert parse_range("100") == (100, 100) and parse_range("50:200") == (50, 200)
    assert parse_pair("0:20") == (0.0, 20.0)
    assert parse_priority_mix("0:0.2, 5:0.8") == ((0, 0.2), (5, 0.8))
    assert parse_goodput(["ttft:500", "TPOT:50"]) == {"ttft": 500.0, "tpot": 50.0}
    assert parse_percentiles("50,90,99.9") == (50.0, 90.0, 99.9)
    with pytest.raises(ValueError):
        parse_goodput(["latency:5"])
    bad: list[dict[str, object]] = [
        {"concurrency": 4, "request_rate": 5.0},
        {"concurrency": 4, "max_concurrency": 2},
        {"ramp_up": (1.0, 5.0), "request_rate": 3.0},
        {"duration": 5.0},  # infinite rate bounded only by time
        {"prompt_tokens": (10, 5)},
        {"burstiness": 0.0},
        {"percentiles": (0.0,)},
        {"priority_mix": ((0, 0.0),)},
    ]
    for overrides in bad:
        with pytest.raises(ValueError):
            LoadConfig(**overrides)  # type: ignore[arg-type]
    assert LoadConfig(duration=5.0, request_rate=2.0).request_limit is None
    settings = LoadConfig(api_key="secret", timeout=math.inf).to_dict()
    assert settings["api_key"] == "<redacted>" and settings["timeout"] == "inf"


def test_summary_always_has_the_usual_percentiles() -> None:
    measurements = [_ok(i, ttft=0.01 * (i + 1)) for i in range(10)]
    summary = _result(measurements, percentiles=(75.0,)).summary()
    for key in ("ttft_ms_p50", "ttft_ms_p75", "ttft_ms_p90", "ttft_ms_p99", "e2el_ms_p99"):
        assert summary[key] is not None
    assert "P75 TTFT (ms):" in format_summary(_result(measurements, percentiles=(75.0,)))
    assert LoadConfig().request_limit == 100
