"""A model that raises: the request ends with an error event, the worker lives on."""

from __future__ import annotations

from collections.abc import AsyncIterator

from redis.asyncio import Redis

from llmq import keys
from tests.support.native import submit, wait_ready, wait_status
from tests.support.servers import StartApi, StartWorker
from tests.support.sse import openai_chunks
from worker.model import GenerationRequest, MockModel, count_tokens


class Flaky:
    """Fails at token index 3 when the prompt says so: a backend outside llmq.

    The position is the request's, not the run's: a re-run resumes after the
    tokens already published (``request.generated``), and a poison request fails
    at the same place every time.
    """

    def __init__(self) -> None:
        self.inner = MockModel(tokens_per_second=500)
        self.seen: set[int] = set()

    def count_tokens(self, text: str) -> int:
        return count_tokens(text)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[str]:
        n = len(request.generated)
        first_run = request.seed not in self.seen
        self.seen.add(request.seed)
        async for token in self.inner.generate(request):
            if n == 3 and (
                "explode" in request.prompt or ("hiccup" in request.prompt and first_run)
            ):
                raise RuntimeError("device lost")
            n += 1
            yield token


async def test_model_error_ends_the_request_not_the_worker(
    start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    await start_worker(model=Flaky())
    api = await start_api()
    async with api.client() as client:
        await wait_ready(client)
        body = {"model": "mock", "prompt": "please explode", "max_tokens": 10, "stream": True}
        async with client.stream("POST", "/v1/completions", json=body) as r:
            chunks = await openai_chunks(r)
        failed = await submit(client, "explode again", max_tokens=10)
        rec = await wait_status(client, failed, "failed")
        fine = await submit(client, "all good", max_tokens=10)
        ok = await wait_status(client, fine, "done")
        hiccup = {"model": "mock", "prompt": "a hiccup", "max_tokens": 10, "seed": 5}
        async with client.stream("POST", "/v1/completions", json={**hiccup, "stream": True}) as r:
            recovered = await openai_chunks(r)
        clean = (await client.post("/v1/completions", json=hiccup)).json()
    texts = [c["choices"][0]["text"] for c in chunks if c.get("choices")]
    assert len("".join(texts).split()) == 3
    assert chunks[-1]["error"]["code"] == "model_error"
    assert "device lost" in chunks[-1]["error"]["message"]
    # a poison request: retried up to max_tries (3), each re-run resuming after the
    # 3 tokens published and failing again at once, then failed; the worker serves on
    assert rec["finish_reason"] == "error" and rec["completion_tokens"] == 3
    assert rec["attempts"] == 3
    assert ok["completion_tokens"] == 10
    # a transient failure: the second run succeeds, and the client sees each token once
    text = "".join(c["choices"][0]["text"] for c in recovered if c.get("choices"))
    assert text == clean["choices"][0]["text"] and len(text.split()) == 10
    last = (await redis.xrevrange(keys.stream(failed), count=1))[0][1]
    assert last["type"] == "error"
