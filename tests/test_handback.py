"""SIGTERM hand-back: a stopping worker's unfinished request goes back at its original
score, and its streaming client sees neither an error nor a repeated token."""

from __future__ import annotations

import signal
from typing import Any

import pytest
from redis.asyncio import Redis

from llmq.protocol import keys
from tests.support.native import post_request, record, wait_status
from tests.support.servers import SpawnWorkers, StartApi
from tests.support.sse import frames
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

BODY = {"model": "mock", "prompt": "survive this", "max_tokens": 80, "seed": 11}


async def queue_once_holding(redis: Redis, rid: str) -> list[str]:
    """The queue's order as soon as it holds ``rid``."""
    order: list[str] = []

    async def holds() -> bool:
        order[:] = await redis.zrange(keys.queue("mock"), 0, -1)
        return rid in order

    await wait_until(holds, timeout=10, what=f"{rid} to be handed back to the queue")
    return order


@pytest.mark.slow
async def test_a_stopping_worker_hands_back_at_the_original_score_and_the_client_sees_no_seam(
    start_api: StartApi, spawn_workers: SpawnWorkers, redis: Redis
) -> None:
    """Worker A runs the streamed request R, worker B a long blocker; L arrives after R.
    A gets SIGTERM: R must go back *ahead of* L (its original score, not a new one),
    so B runs R before L, and R's client gets the undisturbed run's text."""
    procs = await spawn_workers(2, concurrency=1, model_tokens_per_second=100, drain_seconds=0.3)
    api = await start_api()
    async with api.client() as client:
        expected = (await client.post("/v1/completions", json=BODY)).json()
        blocker = await post_request(client, "blocker", max_tokens=250)
        b_worker = (await wait_status(client, blocker, "running"))["worker"]
        owner = next(p for p in procs if f"-{p.pid}-" not in b_worker)
        chunks: list[Any] = []
        order_after_hand_back: list[str] = []
        rid = ""
        later = ""
        async with client.stream("POST", "/v1/completions", json={**BODY, "stream": True}) as r:
            async for frame in frames(r):
                if frame.data == "[DONE]":
                    break
                chunks.append(frame.json())
                if len(chunks) == 10:
                    rid = chunks[0]["id"].removeprefix("cmpl-")
                    later = await post_request(client, "later", max_tokens=2)
                    owner.signal(signal.SIGTERM)
                    order_after_hand_back = await queue_once_holding(redis, rid)
        assert owner.wait(15) == 0
        rerun = await record(client, rid)
        after = await wait_status(client, later, "done", timeout=20)
    assert order_after_hand_back == [rid, later], "handed back behind a later request"
    assert not [c for c in chunks if "error" in c]
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == expected["choices"][0]["text"], "tokens lost or repeated"
    assert rerun["attempts"] == 2 and rerun["status"] == "done"
    assert rerun["worker"] == b_worker
    assert after["started_at"] >= rerun["finished_at"]  # one slot: R ran first
    assert "handed back to the queue" in owner.output()
