"""The in-process baseline server and runs of the whole generator against it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from llmq.model.interface import GenerationRequest, Output
from loadgen import LoadConfig, run_load
from loadgen.baseline import InferenceRequest, InferenceServer
from loadgen.measurements import StreamClock
from loadgen.workload import RequestSpec
from worker.mock import MockBackend


@dataclass
class CountingModel:
    """Wraps the mock and counts generations running at once, independently of the server."""

    inner: MockBackend
    running: int = 0
    peak: int = 0

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Output]:
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            async for token in self.inner.generate(request):
                yield token
        finally:
            self.running -= 1


async def test_busy_wait_never_exceeds_max_concurrent() -> None:
    model = CountingModel(MockBackend(tokens_per_second=2000.0, prefill_seconds_per_token=0.0))
    server = InferenceServer(model, max_concurrent=3, poll_seconds=0.001)

    async def consume(i: int) -> int:
        tokens = 0
        request = InferenceRequest(f"r{i}", "a b c", max_tokens=5)
        async for response in server.handle_request(request):
            assert server.active_requests <= 3
            tokens = response.generated_tokens
        return tokens

    counts = await asyncio.gather(*(consume(i) for i in range(25)))
    assert counts == [5] * 25
    assert model.peak == 3 and server.peak_active == 3
    assert server.active_requests == 0 and server.completed == 25


async def test_cancelled_request_frees_its_slot() -> None:
    server = InferenceServer(MockBackend(tokens_per_second=1.0), max_concurrent=1)
    stream = server.handle_request(InferenceRequest("slow", "x", max_tokens=100))
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await anext(stream)  # admitted, then stuck in the first token's wait
    await stream.aclose()
    assert server.active_requests == 0


async def test_a_prompt_the_model_has_cached_yields_as_many_tokens() -> None:
    """The mock reports a cached prefix before the first token: not a token itself."""
    server = InferenceServer(MockBackend(tokens_per_second=2000.0), max_concurrent=1)
    prompt = " ".join(f"w{i}" for i in range(40))
    for rid in ("cold", "cached"):
        responses = [r async for r in server.handle_request(InferenceRequest(rid, prompt, 5))]
        assert [r.generated_tokens for r in responses] == [1, 2, 3, 4, 5, 5]
        assert all(r.token for r in responses[:-1])


def _config(**overrides: object) -> LoadConfig:
    base: dict[str, object] = {
        "in_process": True,
        "tokens_per_second": 100.0,
        "prefill_seconds_per_token": 0.001,
        "prompt_tokens": (20, 20),
        "output_tokens": (5, 5),
        "num_requests": 6,
        "baseline_concurrency": 8,
        "seed": 3,
    }
    base.update(overrides)
    return LoadConfig(**base)  # type: ignore[arg-type]


async def test_in_process_run_reports_model_timings() -> None:
    # One request at a time: the mock's engine shares its steps, so concurrent prompts
    # would prefill together and each TTFT would include the others' prefill.
    result = await run_load(_config(concurrency=1))
    s = result.summary()
    assert result.target == "in_process"
    assert s["completed"] == 6 and s["failed"] == 0
    # TTFT = prefill (20 x 1 ms) + one decode step (10 ms); TPOT = 10 ms; E2E = 20 + 5 x 10.
    # The mock's schedule is a floor no machine can beat; a loaded one only delays, so
    # the upper bounds are its margin (and would still catch a model ten times slower).
    # The mock keeps its step schedule: a step delayed by a busy machine is followed by
    # quicker ones, so single gaps between tokens are not bounded below.
    assert 0.027 <= s["ttft_ms_median"] / 1000 < 0.3
    assert 0 < s["itl_ms_median"] < 100
    assert 0 < s["tpot_ms_median"] < 100
    assert 70 * 0.9 <= s["e2el_ms_median"] < 700
    assert all(r.output_tokens == 5 and len(r.itl_s) == 4 for r in result.measurements)
    for r in result.measurements:  # the figures agree with each other
        assert r.ttft_s is not None and r.e2e_s is not None and r.tpot_s is not None
        assert r.ttft_s + sum(r.itl_s) <= r.e2e_s + 1e-9  # the last token, then the end
        assert r.tpot_s == pytest.approx((r.e2e_s - r.ttft_s) / 4)
    assert [r.index for r in result.measurements] == list(range(6))


async def test_one_slot_makes_requests_wait_their_turn() -> None:
    result = await run_load(_config(baseline_concurrency=1, num_requests=3))
    ttfts = sorted(r.ttft_s or 0.0 for r in result.measurements)
    e2e = min(r.e2e_s or 0.0 for r in result.measurements)
    # The second admitted request cannot get a token before the first one finishes.
    assert ttfts[1] > e2e
    assert ttfts[2] > 2 * e2e * 0.9


async def test_closed_loop_keeps_n_users_in_flight_and_warmup_is_excluded() -> None:
    result = await run_load(_config(concurrency=2, num_requests=6, warmup=2))
    s = result.summary()
    assert s["completed"] == 6 and s["peak_in_flight"] == 2
    assert s["warmup"] == 2 and len(result.warmup_measurements) == 2
    # a user sends its next request as soon as one ends (sent when scheduled: the bound
    # is only a loaded machine's margin, the figure is the benchmarks' to measure)
    assert all(r.lag_s < 0.5 for r in result.measurements)


async def test_duration_bounds_a_closed_loop() -> None:
    result = await run_load(_config(concurrency=2, num_requests=None, duration=0.2))
    assert 2 <= len(result.measurements) <= 12  # ~70 ms per request, two users, 0.2 s
    # nothing is started after the duration (when it left is up to a loaded machine)
    assert all(r.scheduled_s < 0.2 for r in result.measurements)


async def test_timeouts_are_classified_and_free_the_server() -> None:
    result = await run_load(_config(tokens_per_second=5.0, timeout=0.1, num_requests=3))
    assert result.summary()["failures"]["timeout"] == 3


class _BlockingTarget:
    """A target whose sends block the event loop: the generator must notice it lagged."""

    name = "blocking"

    async def send(self, spec: RequestSpec, clock: StreamClock) -> None:
        clock.sent()
        time.sleep(0.1)  # the injected fault: CPU work holding the loop
        clock.content()

    async def prepare(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


async def test_a_lagging_generator_is_flagged() -> None:
    """A send that holds the loop 100 ms at 200 requests/s: the last sends are most of a
    second late. The threshold here is above what a loaded machine's own stalls
    delay a calm run by (the default, 10 ms, is for a benchmark's quiet machine)."""
    threshold = 250.0
    config = LoadConfig(request_rate=200.0, num_requests=10, seed=1, lag_threshold_ms=threshold)
    result = await run_load(config, target=_BlockingTarget())
    s = result.summary()
    assert s["lagged"] is True and s["lag_ms_p99"] > threshold
    calm = await run_load(
        LoadConfig(
            request_rate=200.0,
            num_requests=10,
            seed=1,
            lag_threshold_ms=threshold,
            in_process=True,
            tokens_per_second=1000.0,
            output_tokens=(2, 2),
            prompt_tokens=(2, 2),
        )
    )
    assert calm.summary()["lagged"] is False
