"""A model that raises: the request ends with an error event, the worker lives on."""

from __future__ import annotations

from redis.asyncio import Redis

from llmq.protocol import keys
from tests.support.models import Flaky
from tests.support.native import post_request, wait_ready, wait_status
from tests.support.servers import StartApi, StartWorker
from tests.support.sse import openai_chunks


async def test_model_error_ends_the_request_not_the_worker(
    start_api: StartApi, start_worker: StartWorker, redis: Redis
) -> None:
    await start_worker(backend=Flaky())
    api = await start_api()
    async with api.client() as client:
        await wait_ready(client)
        body = {"model": "mock", "prompt": "please explode", "max_tokens": 10, "stream": True}
        async with client.stream("POST", "/v1/completions", json=body) as r:
            chunks = await openai_chunks(r)
        failed = await post_request(client, "explode again", max_tokens=10)
        rec = await wait_status(client, failed, "failed")
        fine = await post_request(client, "all good", max_tokens=10)
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
