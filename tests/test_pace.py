"""The worker's pace (``worker/pace.py``): what the adaptive routing guard prices."""

from __future__ import annotations

import pytest

from llmq.model.blocks import BLOCK_SIZE
from llmq.protocol.routing import UNMEASURED, Pace
from worker.pace import MIN_SPREAD_TOKENS, SAMPLES, PaceMeter

pytestmark = pytest.mark.timeout(10)


def test_nothing_is_measured_before_a_run() -> None:
    assert PaceMeter().now() == UNMEASURED


def test_the_block_cost_is_the_slope_not_the_first_tokens_floor() -> None:
    """A first token costs 30 ms whatever the prompt, then 0.2 ms per uncached token: the
    floor does not count (a short prompt would otherwise read as costly)."""
    meter = PaceMeter()
    for uncached in (8, 500, 1000, 20, 2000):
        meter.ran(uncached, 0.030 + 0.0002 * uncached, 1.0)
    assert meter.now().block_us == round(0.0002 * BLOCK_SIZE * 1e6)


def test_no_slope_is_read_from_prompts_of_one_length() -> None:
    meter = PaceMeter()
    for _ in range(10):
        meter.ran(100, 0.05, 1.0)
    meter.ran(100 + MIN_SPREAD_TOKENS - 1, 0.06, 1.0)
    assert meter.now().block_us == 0
    meter.ran(100 + MIN_SPREAD_TOKENS, 0.06, 1.0)
    assert meter.now().block_us > 0


def test_the_service_time_follows_the_runs_and_old_samples_leave() -> None:
    meter = PaceMeter()
    meter.ran(10, 0.01, 2.0)
    assert meter.now() == Pace(service_ms=2000, block_us=0)
    for _ in range(100):
        meter.ran(10, 0.01, 1.0)
    assert 1000 <= meter.now().service_ms < 1010
    # the slope of the last SAMPLES runs only: an engine that got faster reads as faster
    for uncached in range(0, 1000 * SAMPLES, 1000):
        meter.ran(uncached, 0.001 * uncached, 1.0)
    for uncached in range(0, 1000 * SAMPLES, 1000):
        meter.ran(uncached, 0.0001 * uncached, 1.0)
    assert meter.now().block_us == round(0.0001 * BLOCK_SIZE * 1e6)
