"""Bad input gets a 4xx in OpenAI's error shape, and leaves nothing behind in Redis."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from llmq.protocol import keys
from tests.support.servers import RunningApi, StartApi, StartWorker

BAD_COMPLETIONS: list[tuple[Any, int, str | None]] = [
    ({"model": "mock"}, 400, "prompt"),
    ({"model": "mock", "prompt": ""}, 400, "prompt"),
    ({"model": "mock", "prompt": "   "}, 400, "prompt"),
    ({"model": "mock", "prompt": []}, 400, "prompt"),
    ({"model": "mock", "prompt": ["a", "b", "c", "d", "e"]}, 400, "prompt"),
    ({"model": "mock", "prompt": ["a", " "]}, 400, "prompt[1]"),
    ({"model": "mock", "prompt": ["a", "b"], "n": 3}, 400, "n"),
    ({"model": "mock", "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"model": "mock", "prompt": "x", "max_tokens": -3}, 400, "max_tokens"),
    ({"model": "mock", "prompt": "x", "max_tokens": 65}, 400, "max_tokens"),
    ({"model": "mock", "prompt": "x", "max_tokens": "many"}, 400, "max_tokens"),
    ({"model": "mock", "prompt": "word " * 33}, 400, "prompt"),
    ({"model": "mock", "prompt": "x", "n": 5}, 400, "n"),
    ({"model": "mock", "prompt": "x", "n": 0}, 400, "n"),
    ({"model": "mock", "prompt": "x", "n": 1.5}, 400, "n"),
    ({"model": "mock", "prompt": "x", "max_tokens": True}, 400, "max_tokens"),
    ({"model": "mock", "prompt": "x", "max_tokens": 2.0}, 400, "max_tokens"),
    ({"model": "mock", "prompt": "x", "stream": "yes"}, 400, "stream"),
    ({"model": "mock", "prompt": "x", "seed": False}, 400, "seed"),
    ({"model": "mock", "prompt": "x", "temperature": "1"}, 400, "temperature"),
    ({"model": "mock", "prompt": "x", "priority": True}, 400, "priority"),
    ({"model": "mock", "prompt": "x", "max_tokens": 5, "min_tokens": 6}, 400, "min_tokens"),
    ({"model": "mock", "prompt": "x", "logprobs": 6}, 400, "logprobs"),
    ({"model": "mock", "prompt": "x", "ignore_eos": 1}, 400, "ignore_eos"),
    ({"model": "mock", "prompt": "x", "echo": True}, 400, "echo"),
    ({"model": "mock", "prompt": "x", "best_of": 3}, 400, "best_of"),
    ({"model": "mock", "prompt": "x", "suffix": "end"}, 400, "suffix"),
    ({"model": "mock", "prompt": "x", "temperature": 5}, 400, "temperature"),
    ({"model": "mock", "prompt": "x", "priority": 10**9}, 400, "priority"),
    ({"model": "mock", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ({"model": "", "prompt": "x"}, 400, "model"),
    ({"model": "gpt-nope", "prompt": "x"}, 404, "model"),
    ({"prompt": "x"}, 400, "model"),
    ([1, 2, 3], 400, None),
    ("just a string", 400, None),
]

BAD_CHATS: list[tuple[Any, int, str | None]] = [
    ({"model": "mock", "messages": []}, 400, "messages"),
    ({"model": "mock", "messages": [{"role": "user", "content": ""}]}, 400, "messages"),
    ({"model": "mock", "messages": [{"role": "robot", "content": "x"}]}, 400, None),
    ({"model": "mock", "messages": [{"content": "x"}]}, 400, None),
    (
        {"model": "mock", "messages": [{"role": "user", "content": "x"}], "max_tokens": 99},
        400,
        "max_tokens",
    ),
    (
        {
            "model": "mock",
            "messages": [{"role": "user", "content": "x"}],
            "max_completion_tokens": 0,
        },
        400,
        "max_completion_tokens",
    ),
]


@pytest.fixture
async def limited(start_api: StartApi, start_worker: StartWorker) -> RunningApi:
    await start_worker()
    return await start_api(
        max_tokens_limit=64, max_prompt_tokens=32, max_body_bytes=4096, max_choices=4
    )


async def _request_keys(redis: Redis) -> set[Any]:
    """Every key but the batch feeder's lease, which the API takes on its own schedule."""
    lease = (keys.BATCH_FEEDER, keys.BATCH_FEEDER.encode())
    return {k for k in await redis.keys("*") if k not in lease}


async def _assert_refused(
    api: RunningApi, redis: Redis, path: str, body: Any, status: int, param: str | None
) -> None:
    before = await _request_keys(redis)
    async with api.client() as client:
        r = await client.post(path, json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if param is not None:
        assert error["param"] == param
    assert await _request_keys(redis) == before, "a refused request left keys behind"
    assert await redis.zcard(keys.queue("mock")) == 0


@pytest.mark.parametrize(("body", "status", "param"), BAD_COMPLETIONS)
async def test_bad_completion_requests(
    limited: RunningApi, redis: Redis, body: Any, status: int, param: str | None
) -> None:
    await _assert_refused(limited, redis, "/v1/completions", body, status, param)


@pytest.mark.parametrize(("body", "status", "param"), BAD_CHATS)
async def test_bad_chat_requests(
    limited: RunningApi, redis: Redis, body: Any, status: int, param: str | None
) -> None:
    await _assert_refused(limited, redis, "/v1/chat/completions", body, status, param)


async def test_bad_native_request(limited: RunningApi, redis: Redis) -> None:
    await _assert_refused(limited, redis, "/v1/requests", {"model": "mock"}, 400, "prompt")
    body = {"model": "mock", "prompt": "x", "n": 2}
    await _assert_refused(limited, redis, "/v1/requests", body, 400, "n")


async def test_invalid_json(limited: RunningApi, redis: Redis) -> None:
    async with limited.client() as client:
        r = await client.post(
            "/v1/completions", content=b"{not json", headers={"content-type": "application/json"}
        )
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_json"
    assert await redis.zcard(keys.queue("mock")) == 0


@pytest.mark.parametrize("chunked", [False, True])
async def test_oversized_body(limited: RunningApi, redis: Redis, chunked: bool) -> None:
    payload = b'{"model": "mock", "prompt": "' + b"a" * 10_000 + b'"}'

    async def chunks() -> Any:
        for i in range(0, len(payload), 1000):
            yield payload[i : i + 1000]

    before = await _request_keys(redis)  # registry, liveness and relay keys
    async with limited.client() as client:
        r = await client.post(
            "/v1/completions",
            content=chunks() if chunked else payload,
            headers={"content-type": "application/json"},
        )
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"
    assert await _request_keys(redis) == before
    assert await redis.zcard(keys.queue("mock")) == 0


async def test_unknown_route_and_method(limited: RunningApi) -> None:
    async with limited.client() as client:
        missing = await client.get("/v1/nothing")
        wrong = await client.get("/v1/completions")
    assert missing.status_code == 404 and "error" in missing.json()
    assert wrong.status_code == 405 and "error" in wrong.json()
