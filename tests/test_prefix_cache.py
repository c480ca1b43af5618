"""A prompt the worker's engine has cached: OpenAI's ``cached_tokens`` in every place a
client reads usage, and vLLM's prefix cache figures on ``/metrics``."""

from __future__ import annotations

from typing import Any

import httpx

from api.exposition import KV_CACHE_USAGE, WORKER_CACHE_HITS, WORKER_CACHE_QUERIES
from llmq import metrics
from tests.support.exposition import samples, value
from tests.support.native import post_request, wait_ready, wait_status
from tests.support.servers import StartApi, StartWorker
from tests.support.sse import frames, openai_chunks
from tests.support.waiting import wait_until

#: 40 tokens: two full blocks of 16 can be cached, the rest is always computed.
PROMPT = " ".join(f"word{i}" for i in range(40))


async def completion(client: httpx.AsyncClient, **extra: Any) -> dict[str, Any]:
    body = {"model": "mock", "prompt": PROMPT, "max_tokens": 3, **extra}
    r = await client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


async def test_cached_prompt_tokens_reach_responses_events_records_and_metrics(
    start_api: StartApi, start_worker: StartWorker
) -> None:
    await start_worker()
    api = await start_api()
    async with api.client() as client:
        await wait_ready(client)
        first = await completion(client)
        # the prompt was new: nothing cached, and a miss is not reported
        assert first["usage"] == {"prompt_tokens": 40, "completion_tokens": 3, "total_tokens": 43}
        again = await completion(client)
        assert again["usage"]["prompt_tokens_details"] == {"cached_tokens": 32}
        body = {"model": "mock", "prompt": PROMPT, "max_tokens": 3, "stream": True}
        body["stream_options"] = {"include_usage": True}
        async with client.stream("POST", "/v1/completions", json=body) as r:
            chunks = await openai_chunks(r)
        assert chunks[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 32}
        rid = await post_request(client, PROMPT, max_tokens=3)
        record = await wait_status(client, rid, "done")
        assert record["cached_tokens"] == 32
        async with client.stream("GET", f"/v1/requests/{rid}/events") as r:
            done = [f.json() async for f in frames(r) if f.event == "done"]
        assert done[0]["usage"]["prompt_tokens_details"] == {"cached_tokens": 32}

        text = ""

        async def counted() -> bool:
            nonlocal text
            text = (await client.get("/metrics")).text
            # four requests of 40 prompt tokens, three of them with 32 cached
            return value(text, f"{metrics.PREFIX_CACHE_HITS.name}_total") == 96

        await wait_until(counted, timeout=10, what="the prefix cache counters")
        assert value(text, f"{metrics.PREFIX_CACHE_QUERIES.name}_total", model="mock") == 160
        # the worker's own figures, through its heartbeat
        assert value(text, f"{WORKER_CACHE_QUERIES}_total") == 160
        assert value(text, f"{WORKER_CACHE_HITS}_total") == 96
        usage = [v for (name, _), v in samples(text).items() if name == KV_CACHE_USAGE]
        assert usage == [0.0]  # one worker, nothing running
