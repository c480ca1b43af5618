"""Optional API keys: bearer auth, and each request visible only to its own key."""

from __future__ import annotations

import openai
import pytest
from redis.asyncio import Redis

from llmq.protocol import keys
from tests.support.native import wait_ready
from tests.support.servers import RunningApi, StartApi, StartWorker

pytestmark = pytest.mark.timeout(60)

K1, K2 = "sk-first-key", "sk-second-key"


@pytest.fixture
async def secured(start_api: StartApi, start_worker: StartWorker) -> RunningApi:
    await start_worker()
    api = await start_api(api_keys=f"{K1}, {K2}")
    async with api.client(headers={"Authorization": f"Bearer {K1}"}) as client:
        await wait_ready(client)
    return api


async def test_keys_are_required(secured: RunningApi, redis: Redis) -> None:
    body = {"model": "mock", "prompt": "x", "max_tokens": 2}
    async with secured.client() as anonymous:
        missing = await anonymous.post("/v1/completions", json=body)
        wrong = await anonymous.post(
            "/v1/completions", json=body, headers={"Authorization": "Bearer nope"}
        )
        basic = await anonymous.post(
            "/v1/completions", json=body, headers={"Authorization": f"Basic {K1}"}
        )
        models = await anonymous.get("/v1/models")
        health = await anonymous.get("/healthz")
        metrics = await anonymous.get("/metrics")
    for r in (missing, wrong, basic, models):
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "invalid_api_key"
        assert r.headers["www-authenticate"] == "Bearer"
    assert health.status_code == 200 and metrics.status_code == 200
    assert await redis.zcard(keys.queue("mock")) == 0


async def test_a_request_is_visible_only_to_its_key(secured: RunningApi) -> None:
    async with (
        secured.client(headers={"Authorization": f"Bearer {K1}"}) as one,
        secured.client(headers={"Authorization": f"Bearer {K2}"}) as two,
    ):
        created = await one.post("/v1/requests", json={"model": "mock", "prompt": "mine"})
        rid = created.json()["id"]
        mine = await one.get(f"/v1/requests/{rid}")
        theirs = [
            await two.get(f"/v1/requests/{rid}"),
            await two.get(f"/v1/requests/{rid}/events"),
            await two.delete(f"/v1/requests/{rid}"),
        ]
    assert created.status_code == 202 and mine.status_code == 200
    assert "owner" not in mine.json()
    assert [r.status_code for r in theirs] == [404, 404, 404]


async def test_openai_sdk_with_a_key(secured: RunningApi) -> None:
    client = openai.AsyncOpenAI(base_url=secured.url + "/v1", api_key=K2)
    reply = await client.completions.create(model="mock", prompt="hello", max_tokens=3)
    assert reply.usage is not None and reply.usage.completion_tokens == 3
    await client.close()
    rejected = openai.AsyncOpenAI(base_url=secured.url + "/v1", api_key="bad", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        await rejected.completions.create(model="mock", prompt="hello", max_tokens=3)
    await rejected.close()
