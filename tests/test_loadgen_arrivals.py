"""The arrival process and the request workload: rate, dispersion, ramps, reproducibility.

The statistical checks use fixed seeds and tolerances several standard errors
wide, so they pass deterministically yet would fail for a wrong rate or shape.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from llmq.model.tokenizer import count_tokens
from loadgen.arrivals import RampClock, ramp_horizon, schedule
from loadgen.config import LoadConfig
from loadgen.workload import Workload, load_dataset


def _gaps(rate: float, burstiness: float, n: int, seed: int = 7) -> npt.NDArray[np.float64]:
    times = schedule(np.random.default_rng(seed), rate=rate, burstiness=burstiness, num_requests=n)
    assert times[0] == 0.0  # the first request goes at once, as in vLLM
    assert np.all(np.diff(times) >= 0)
    return np.diff(times)


@pytest.mark.parametrize(
    ("burstiness", "cv_tolerance"),
    [(1.0, 0.03), (0.25, 0.08), (4.0, 0.03)],
)
def test_gamma_arrivals_have_the_asked_rate_and_dispersion(
    burstiness: float, cv_tolerance: float
) -> None:
    rate = 40.0
    gaps = _gaps(rate, burstiness, 40_000)
    assert gaps.mean() == pytest.approx(1.0 / rate, rel=0.03)
    cv = gaps.std() / gaps.mean()
    assert cv == pytest.approx(1.0 / math.sqrt(burstiness), rel=cv_tolerance)


def test_poisson_counts_in_windows_have_poisson_variance() -> None:
    # For a Poisson process, counts in disjoint windows have variance == mean.
    times = schedule(np.random.default_rng(3), rate=100.0, duration=400.0)
    counts = np.bincount(times.astype(int), minlength=400)
    assert counts.mean() == pytest.approx(100.0, rel=0.02)
    assert counts.var() / counts.mean() == pytest.approx(1.0, abs=0.2)


def test_bursty_arrivals_are_overdispersed() -> None:
    times = schedule(np.random.default_rng(3), rate=100.0, burstiness=0.2, duration=400.0)
    counts = np.bincount(times.astype(int), minlength=400)
    assert counts.var() / counts.mean() > 3.0


def test_infinite_rate_sends_everything_at_once() -> None:
    times = schedule(np.random.default_rng(0), rate=math.inf, num_requests=25)
    assert times.tolist() == [0.0] * 25


def test_duration_bounds_the_schedule() -> None:
    times = schedule(np.random.default_rng(1), rate=200.0, duration=20.0)
    assert times.max() < 20.0
    assert len(times) == pytest.approx(4000, rel=0.05)
    both = schedule(np.random.default_rng(1), rate=200.0, duration=20.0, num_requests=50)
    assert len(both) == 50  # whichever bound comes first


def test_same_seed_same_schedule_other_seed_other_schedule() -> None:
    a = schedule(np.random.default_rng([5, 0]), rate=10.0, burstiness=0.5, num_requests=200)
    b = schedule(np.random.default_rng([5, 0]), rate=10.0, burstiness=0.5, num_requests=200)
    c = schedule(np.random.default_rng([6, 0]), rate=10.0, burstiness=0.5, num_requests=200)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_ramp_clock_inverts_the_cumulative_rate() -> None:
    for start, end in [(0.0, 100.0), (10.0, 50.0), (80.0, 20.0), (30.0, 30.0)]:
        clock = RampClock(start, end, horizon=10.0)
        for t in np.linspace(0.0, 15.0, 31):
            ramped = min(t, 10.0)  # the rate rises linearly until the horizon, then holds
            rate_t = start + (end - start) * ramped / 10.0
            cumulative = (start + rate_t) / 2 * ramped + end * max(t - 10.0, 0.0)
            assert clock.seconds(cumulative) == pytest.approx(t, abs=1e-9)


def test_linear_ramp_follows_the_rate() -> None:
    # 0 -> 200 req/s over 40 s: Λ(t) = 2.5 t², so 1000 in the first half, 3000 in the second.
    times = schedule(np.random.default_rng(11), rate=math.inf, ramp=(0.0, 200.0), duration=40.0)
    first = int((times < 20.0).sum())
    second = int((times >= 20.0).sum())
    # Tolerances are about four Poisson standard deviations.
    assert first == pytest.approx(1000, rel=0.13)
    assert second == pytest.approx(3000, rel=0.075)
    quarter = int((times < 10.0).sum())
    assert quarter == pytest.approx(250, rel=0.25)


def test_ramp_over_a_request_count_spans_the_expected_run() -> None:
    assert ramp_horizon((10.0, 30.0), None, 400) == pytest.approx(20.0)
    times = schedule(np.random.default_rng(2), rate=math.inf, ramp=(10.0, 30.0), num_requests=400)
    assert len(times) == 400
    assert times[-1] == pytest.approx(20.0, rel=0.1)


def test_synthetic_prompts_have_the_asked_lengths_and_are_distinct() -> None:
    config = LoadConfig(prompt_tokens=(5, 40), output_tokens=(3, 9), seed=4)
    workload = Workload(config)
    specs = [workload.spec(i) for i in range(300)]
    assert all(count_tokens(s.prompt) == s.prompt_tokens for s in specs)
    assert {s.prompt_tokens for s in specs} >= {5, 40}
    assert all(5 <= s.prompt_tokens <= 40 and 3 <= s.max_tokens <= 9 for s in specs)
    assert len({s.prompt for s in specs}) == 300
    assert all(s.priority is None for s in specs)
    again = Workload(config)
    assert [again.spec(i) for i in range(300)] == specs
    warm = [workload.spec(i, warmup=True).prompt for i in range(50)]
    assert not set(warm) & {s.prompt for s in specs}


def test_priority_mix_proportions() -> None:
    workload = Workload(LoadConfig(priority_mix=((0, 0.2), (5, 0.8)), seed=9))
    priorities = [workload.spec(i).priority for i in range(5000)]
    assert set(priorities) == {0, 5}
    assert priorities.count(0) / 5000 == pytest.approx(0.2, abs=0.02)


def test_dataset_lines_drive_prompts_lengths_and_priorities(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    rows = [
        {"prompt": "one two three", "max_tokens": 4, "priority": 2},
        {"prompt": "alpha beta", "max_tokens": 7},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    assert len(load_dataset(path)) == 2
    workload = Workload(LoadConfig(dataset=str(path), priority_mix=((9, 1.0),)))
    specs = [workload.spec(i) for i in range(6)]
    seen = {(s.prompt, s.prompt_tokens, s.max_tokens, s.priority) for s in specs}
    assert seen == {("one two three", 3, 4, 2), ("alpha beta", 2, 7, 9)}


def test_bad_dataset_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "x"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:1"):
        load_dataset(path)
    path.write_text('{"prompt": 3, "max_tokens": 2}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:1"):
        load_dataset(path)
