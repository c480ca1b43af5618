"""The mock's defaults look like a model: answers stop by themselves at a mean length
(``LLMQ_MODEL_MEAN_TOKENS``), the same per seed; ``ignore_eos``/``min_tokens`` and a
mean of 0 keep fixed lengths; a served request without max_tokens ends ``stop``."""

from __future__ import annotations

import statistics

from llmq.model.interface import GenerationRequest
from llmq.settings import WorkerSettings
from tests.support.native import wait_ready
from tests.support.servers import RunningApi, StartApi, StartWorker
from worker.backends import mock_backend

HI = [{"role": "user", "content": "hi"}]


def request(seed: int, **kw: object) -> GenerationRequest:
    return GenerationRequest(
        prompt="p",
        max_tokens=1000,
        seed=seed,
        prompt_tokens=1,
        **kw,  # type: ignore[arg-type]
    )


async def lengths(settings: WorkerSettings, seeds: range, **kw: object) -> list[int]:
    model = mock_backend(settings)
    found = []
    for seed in seeds:
        found.append(len([t async for t in model.generate(request(seed, **kw))]))
    return found


async def test_answers_stop_at_the_mean_length_and_repeat_per_seed() -> None:
    settings = WorkerSettings(model_tokens_per_second=1e6, model_mean_tokens=20)
    found = await lengths(settings, range(400))
    assert 15 < statistics.mean(found) < 25  # geometric, mean 20: sd of the mean ~1
    assert found == await lengths(settings, range(400))
    assert max(found) < 1000


async def test_fixed_lengths_stay_available() -> None:
    settings = WorkerSettings(model_tokens_per_second=1e6, model_mean_tokens=20)
    assert await lengths(settings, range(20), ignore_eos=True) == [1000] * 20
    assert min(await lengths(settings, range(20), min_tokens=300)) >= 300
    never = WorkerSettings(model_tokens_per_second=1e6, model_mean_tokens=0)
    assert await lengths(never, range(5)) == [1000] * 5


def test_a_stop_probability_replaces_the_mean() -> None:
    assert WorkerSettings(model_mean_tokens=40).mock_stop_probability() == 1 / 40
    assert WorkerSettings(model_mean_tokens=0).mock_stop_probability() == 0
    both = WorkerSettings(model_mean_tokens=40, model_stop_probability=0.5)
    assert both.mock_stop_probability() == 0.5


async def test_a_default_request_mostly_ends_by_itself(
    start_api: StartApi, start_worker: StartWorker
) -> None:
    """The served default: chat answers without max_tokens end ``stop``."""
    default = WorkerSettings.model_fields["model_mean_tokens"].default
    await start_worker(model_tokens_per_second=5000.0, model_mean_tokens=default)
    api: RunningApi = await start_api()
    reasons = []
    async with api.client() as client:
        await wait_ready(client)
        for seed in range(10):
            r = await client.post(
                "/v1/chat/completions",
                json={
                    "model": "mock",
                    "messages": [{"role": "user", "content": "hi"}],
                    "seed": seed,
                },
            )
            reasons.append(r.json()["choices"][0]["finish_reason"])
    assert reasons.count("stop") >= 8, reasons
