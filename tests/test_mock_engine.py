"""The mock on its engine: shared steps, a prefix cache that reports what it holds."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from llmq.model.blocks import block_hashes
from llmq.model.interface import CacheReporting, GenerationRequest, KVCacheUsage, Output, Report
from llmq.model.tokenizer import WHITESPACE
from llmq.settings import WorkerSettings
from tests.support.waiting import wait_until
from worker.backends import mock_backend
from worker.mock import MockBackend
from worker.mock_engine.profiles import PROFILES


def request(prompt: str, max_tokens: int, prompt_tokens: int | None = None) -> GenerationRequest:
    count = len(prompt.split()) if prompt_tokens is None else prompt_tokens
    return GenerationRequest(prompt=prompt, max_tokens=max_tokens, seed=1, prompt_tokens=count)


async def outputs(model: MockBackend, req: GenerationRequest) -> list[tuple[float, Output]]:
    """(seconds since the start, output) of everything the model emits."""
    out: list[tuple[float, Output]] = []
    start = time.monotonic()
    await model.generate_into(req, lambda o: out.append((time.monotonic() - start, o)))
    return out


def words(n: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


async def test_a_long_prefill_slows_every_sequence_that_shares_its_steps() -> None:
    """A decoding sequence waits for the step that prefills a newcomer's long prompt:
    recomputing a prompt costs everyone, not only its own request."""
    model = MockBackend(tokens_per_second=100, prefill_seconds_per_token=0.001)
    times: list[float] = []
    decoding = asyncio.ensure_future(
        model.generate_into(request("p", 40), lambda _: times.append(time.monotonic()))
    )
    await wait_until(lambda: len(times) >= 3, timeout=5, what="3 tokens")
    newcomer = await outputs(model, request("p", 1, prompt_tokens=200))
    await decoding
    assert newcomer[0][0] >= 0.2  # its own prefill: 200 tokens at 1 ms
    # the step with those 200 prompt tokens took 10 ms + 200 ms for the decoder too
    assert max(b - a for a, b in itertools.pairwise(times)) >= 0.2


async def test_a_cached_prefix_is_reported_before_the_first_token_under_the_apis_names() -> None:
    model = MockBackend(tokens_per_second=1000, prefill_seconds_per_token=0.001)
    heard: list[tuple[list[str], list[str]]] = []
    assert isinstance(model, CacheReporting) and isinstance(model, KVCacheUsage)
    model.watch_cache(lambda stored, evicted: heard.append((list(stored), list(evicted))))
    prompt = words(40)  # two full blocks of 16, and 8 tokens more
    first = await outputs(model, request(prompt, 3))
    assert not any(isinstance(o, Report) for _, o in first)  # nothing cached: no report
    assert heard == [(block_hashes(WHITESPACE.tokens(prompt)), [])]
    assert first[0][0] >= 0.04  # 40 tokens prefilled
    again = await outputs(model, request(prompt, 3))
    report = again[0][1]
    assert isinstance(report, Report) and report.cached_tokens == 32
    assert [o for _, o in again[1:]] == [o for _, o in first]  # the same tokens
    assert len(heard) == 1  # nothing new was cached


async def test_a_listener_that_raises_does_not_stop_the_engine() -> None:
    model = MockBackend(tokens_per_second=1000, prefill_seconds_per_token=0.0)

    def broken(stored: object, evicted: object) -> None:
        raise RuntimeError("listener bug")

    model.watch_cache(broken)
    out = await outputs(model, request(words(40), 5))
    assert len(out) == 5


async def test_evicted_blocks_are_heard_and_kv_usage_follows_the_running_sequences() -> None:
    model = MockBackend(tokens_per_second=50, prefill_seconds_per_token=0.0, kv_blocks=4)
    heard: list[tuple[list[str], list[str]]] = []
    model.watch_cache(lambda stored, evicted: heard.append((list(stored), list(evicted))))
    old = words(32, "old")
    await outputs(model, request(old, 1))
    assert model.kv_usage() == 0.0  # ended: its blocks are cached, not held
    # 48 + 15 tokens: the whole cache, for 15 steps of 20 ms
    running = asyncio.ensure_future(outputs(model, request(words(48, "new"), 15)))
    await wait_until(lambda: model.kv_usage() == 1.0, timeout=5, what="a full cache")
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
    evicted = [name for _, gone in heard for name in gone]
    assert sorted(evicted) == sorted(block_hashes(old.split()))
    await wait_until(lambda: model.kv_usage() == 0.0, timeout=5, what="blocks back")


def test_the_calibrated_profile_makes_prefill_cost_more_than_a_decode_step() -> None:
    profile = PROFILES["llama3-70b-h100x2"]
    model = MockBackend.from_profile(profile)
    assert model.step_token_budget == profile.step_token_budget
    # a 5,000-token prompt takes some 20 decode steps' time: what a cache hit saves
    assert 5000 * model.prefill_seconds_per_token > 20 / model.tokens_per_second
    assert MockBackend.from_profile(PROFILES["default"]) == MockBackend()


def test_the_worker_builds_its_mock_from_the_profile_and_explicit_settings() -> None:
    settings = WorkerSettings(model_profile="llama3-70b-h100x2")
    calibrated = mock_backend(settings)
    assert calibrated == MockBackend.from_profile(
        PROFILES["llama3-70b-h100x2"], stop_probability=settings.mock_stop_probability()
    )
    tuned = mock_backend(
        WorkerSettings(
            model_profile="llama3-70b-h100x2", model_tokens_per_second=10, model_kv_blocks=7
        )
    )
    assert tuned.tokens_per_second == 10 and tuned.kv_blocks == 7
    assert tuned.prefill_seconds_per_token == PROFILES["llama3-70b-h100x2"].prefill_token_seconds
    # the default profile's speeds are the settings', as they always were
    assert mock_backend(WorkerSettings(model_tokens_per_second=80)).tokens_per_second == 80
    with pytest.raises(ValueError, match="unknown model_profile 'h200'"):
        mock_backend(WorkerSettings(model_profile="h200"))
