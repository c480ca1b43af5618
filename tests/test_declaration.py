"""The API counts a prompt with the tokenizer its model's workers declare, and checks it
against their context length (llmq/model/tokenizer.py: the tokenizer belongs to the
model's declaration, not to the API)."""

from __future__ import annotations

from dataclasses import dataclass

from tests.support.servers import StartApi, StartWorker
from worker.mock import MockBackend


@dataclass(frozen=True)
class CharsModel(MockBackend):
    """The mock, declared as an upstream declares itself: ``chars``, 64 tokens of context."""

    tokenizer: str = "chars"
    context_length: int = 64


async def test_prompts_are_counted_with_the_declared_tokenizer(
    start_worker: StartWorker, start_api: StartApi
) -> None:
    await start_worker(backend=CharsModel(tokens_per_second=500))
    api = await start_api()
    async with api.client() as client:
        entry = (await client.get("/v1/workers")).json()["data"][0]
        assert (entry["tokenizer"], entry["context_length"]) == ("chars", 64)
        body = {"model": "mock", "prompt": "abcdefghijkl", "max_tokens": 2}
        reply = (await client.post("/v1/completions", json=body)).json()
        # one whitespace word, three 4-character tokens
        assert reply["usage"]["prompt_tokens"] == 3
        long = await client.post("/v1/completions", json={**body, "prompt": "x" * 400})
        assert long.status_code == 400
        error = long.json()["error"]
        assert error["code"] == "context_length_exceeded"
        assert "about 100 tokens" in error["message"] and "64" in error["message"]


async def test_the_mock_keeps_its_whitespace_words(
    start_worker: StartWorker, start_api: StartApi
) -> None:
    await start_worker()
    api = await start_api()
    async with api.client() as client:
        entry = (await client.get("/v1/workers")).json()["data"][0]
        assert (entry["tokenizer"], entry["context_length"]) == ("whitespace", None)
        body = {"model": "mock", "prompt": "abcdefghijkl mnop", "max_tokens": 2}
        reply = (await client.post("/v1/completions", json=body)).json()
        assert reply["usage"]["prompt_tokens"] == 2
