"""The mock model: timing like the prototype's, deterministic output, no hidden cap; one step
loop for all its sequences."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from llmq.model.interface import GenerationRequest, Output, seed_for
from llmq.model.tokenizer import count_tokens
from tests.support.waiting import wait_until
from worker.mock import MockBackend


def request(
    max_tokens: int, seed: int = 1, prompt_tokens: int = 0, **kw: object
) -> GenerationRequest:
    return GenerationRequest(
        prompt="p",
        max_tokens=max_tokens,
        seed=seed,
        prompt_tokens=prompt_tokens,
        **kw,  # type: ignore[arg-type]
    )


async def collect(model: MockBackend, req: GenerationRequest) -> tuple[list[str], list[float]]:
    tokens: list[str] = []
    times: list[float] = []
    start = time.perf_counter()
    async for token in model.generate(req):
        assert isinstance(token, str), token  # no tool, no cached prompt: tokens only
        tokens.append(token)
        times.append(time.perf_counter() - start)
    return tokens, times


async def test_no_hidden_cap() -> None:
    tokens, _ = await collect(MockBackend(tokens_per_second=5000), request(300))
    assert len(tokens) == 300


async def test_same_seed_same_tokens_other_seed_other_tokens() -> None:
    model = MockBackend(tokens_per_second=5000)
    a, _ = await collect(model, request(40, seed=7))
    b, _ = await collect(model, request(40, seed=7))
    c, _ = await collect(model, request(40, seed=8))
    assert a == b
    assert a != c


async def test_timing_prefill_then_one_token_per_interval() -> None:
    model = MockBackend(tokens_per_second=100, prefill_seconds_per_token=0.001)
    _, times = await collect(model, request(10, prompt_tokens=50))
    # prefill 50 ms, then a token every 10 ms: the 10th at about 150 ms, never sooner
    # (a loaded machine only delays); the upper bound is a loaded machine's margin
    assert times[0] >= 0.058
    assert times[-1] >= 0.148
    assert times[-1] < 1.0
    # each token on its own deadline, never before it (single gaps are not bounded: a
    # step a loaded machine delayed is followed by a quicker one)
    assert all(t >= 0.05 + 0.01 * (k + 1) - 0.002 for k, t in enumerate(times)), times


async def test_stop_probability_ends_early() -> None:
    model = MockBackend(tokens_per_second=5000, stop_probability=0.5)
    lengths = {len((await collect(model, request(100, seed=s)))[0]) for s in range(20)}
    assert max(lengths) < 100


async def test_stop_sequence_ends_before_it() -> None:
    model = MockBackend(tokens_per_second=5000)
    tokens, _ = await collect(model, request(500, stop=("fox",)))
    assert tokens and len(tokens) < 500
    assert all("fox" not in t for t in tokens)


def test_count_tokens_and_seed_for() -> None:
    assert count_tokens("  a b\tc\n") == 3
    assert count_tokens("") == 0
    assert seed_for("abc", 5) == 5
    assert seed_for("abc", None) == seed_for("abc", None) != seed_for("abd", None)


async def test_resumed_run_continues_exactly_where_an_uninterrupted_one_would() -> None:
    """For any cut point, generated + the resumed run's tokens == the uninterrupted run."""
    stopped_early = 0
    for stop_probability, stop, seed in itertools.product(
        (0.0, 0.04, 0.3), ((), ("fox",), ("lazy", "queue")), (3, 21, 77)
    ):
        model = MockBackend(tokens_per_second=1e6, stop_probability=stop_probability)
        full, _ = await collect(model, request(60, seed=seed, stop=stop))
        stopped_early += len(full) < 60
        cuts = {0, 1, 2, len(full) // 2, len(full) - 1, len(full)} - {-1}
        for cut in sorted(cuts):
            resumed = request(60, seed=seed, stop=stop, generated=tuple(full[:cut]))
            rest, _ = await collect(model, resumed)
            assert full[:cut] + rest == full, (stop_probability, stop, seed, cut)
    assert stopped_early >= 10  # the stop draws and stop sequences were exercised


async def test_resumed_run_after_max_tokens_yields_nothing() -> None:
    model = MockBackend(tokens_per_second=1e6)
    full, _ = await collect(model, request(8, seed=4))
    rest, _ = await collect(model, request(8, seed=4, generated=tuple(full)))
    assert len(full) == 8 and rest == []


async def test_resumed_run_prefills_the_generated_tokens_and_does_not_regenerate_them() -> None:
    model = MockBackend(tokens_per_second=20, prefill_seconds_per_token=0.001)
    full, _ = await collect(MockBackend(tokens_per_second=1e6), request(50, seed=9))
    rest, times = await collect(
        model, request(50, seed=9, prompt_tokens=10, generated=tuple(full[:40]))
    )
    assert rest == full[40:]
    # prefill of 10 + 40 tokens (50 ms), then 10 tokens at 50 ms: about 550 ms;
    # generating the 40 again at model speed would take 2 s more (the bound between
    # the two leaves a loaded machine a second)
    assert times[0] >= 0.098
    assert times[-1] >= 0.548
    assert times[-1] < 1.5


async def run_stepped(
    model: MockBackend, req: GenerationRequest, out: list[tuple[float, Output]]
) -> None:
    """``generate_into``, noting when each token came."""
    await model.generate_into(req, lambda token: out.append((time.monotonic(), token)))


async def test_the_step_loop_keeps_each_streams_timing_and_output_and_shares_its_steps() -> None:
    """Sequences started at scattered moments: each one gets its seeded tokens on its own
    schedule (first one interval after the start, then one per interval), while the
    loop wakes up once per step for all of them, not once per token per sequence."""
    interval = 0.01
    model = MockBackend(tokens_per_second=1 / interval, prefill_seconds_per_token=0.0)
    outs: list[list[tuple[float, Output]]] = [[] for _ in range(12)]
    starts, runs = [], []
    for i, out in enumerate(outs):
        starts.append(time.monotonic())
        runs.append(asyncio.ensure_future(run_stepped(model, request(20, seed=i), out)))
        await asyncio.sleep(0.0013)  # scattered over an interval: distinct phases
    await asyncio.gather(*runs)
    for i, (start, out) in enumerate(zip(starts, outs, strict=True)):
        expected, _ = await collect(MockBackend(tokens_per_second=1e6), request(20, seed=i))
        assert [t for _, t in out] == expected
        times = [at - start for at, _ in out]
        assert times[0] >= interval - 0.002
        # on absolute deadlines one interval apart (the first gap up to a step more):
        # the last token 20 intervals after the start, never sooner; the upper bound
        # is a loaded machine's margin
        assert 20 * interval - 0.002 <= times[-1] <= 20 * interval + 0.5
    # a wake-up is a cluster of tokens emitted together
    moments = sorted(at for out in outs for at, _ in out)
    wakeups = 1 + sum(b - a > 0.0005 for a, b in itertools.pairwise(moments))
    assert wakeups < len(moments) / 3, (wakeups, len(moments))


async def test_cancelling_one_stepped_sequence_stops_it_at_once_and_only_it() -> None:
    model = MockBackend(tokens_per_second=100, prefill_seconds_per_token=0.0)
    outs: list[list[tuple[float, Output]]] = [[], [], []]
    runs = [asyncio.ensure_future(run_stepped(model, request(500), out)) for out in outs]
    await wait_until(lambda: all(len(o) >= 3 for o in outs), timeout=5, what="3 tokens each")
    runs[1].cancel()
    at_cancel = len(outs[1])
    others = [len(outs[0]), len(outs[2])]
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(runs[1], timeout=0.1)
    await wait_until(
        lambda: len(outs[0]) >= others[0] + 5 and len(outs[2]) >= others[1] + 5,
        timeout=5,
        what="the others to go on",
    )
    assert len(outs[1]) == at_cancel
    for run in (runs[0], runs[2]):
        run.cancel()
    await asyncio.gather(*runs, return_exceptions=True)


async def test_a_consumer_that_raises_ends_its_sequence_with_the_error_and_no_other() -> None:
    model = MockBackend(tokens_per_second=200, prefill_seconds_per_token=0.0)
    kept: list[tuple[float, Output]] = []

    def broken(token: Output) -> None:
        raise RuntimeError("consumer bug")

    healthy = asyncio.ensure_future(run_stepped(model, request(10), kept))
    with pytest.raises(RuntimeError, match="consumer bug"):
        await model.generate_into(request(10), broken)
    await asyncio.wait_for(healthy, timeout=5)
    assert len(kept) == 10
