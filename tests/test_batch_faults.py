"""A batch under faults: a worker SIGKILLed and the feeding API process SIGKILLed
mid-batch, the feeding API process stopped (SIGTERM) mid-batch, or Redis SIGKILLed and
started again from its AOF; every custom_id is in the output exactly once, each body
equal to the same request run alone (the mock is seeded)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from typing import Any

import httpx
import openai
import pytest
from redis.asyncio import Redis

from llmq.embedded import EmbeddedRedis
from llmq.protocol import keys
from tests.support.native import wait_ready
from tests.support.processes import start_api_process
from tests.support.servers import SpawnWorkers, StartApi, StartWorker
from tests.support.sse import stream_completion
from tests.support.waiting import wait_until
from tests.test_batch import by_custom_id, chat_line, create, finished

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


async def test_every_line_once_and_exact_after_a_worker_and_the_feeding_api_die(
    start_api: StartApi, spawn_workers: SpawnWorkers, redis_url: str, redis: Redis
) -> None:
    procs = await spawn_workers(2, concurrency=2, model_tokens_per_second=100, lease_seconds=1)
    url, feeding = start_api_process(
        redis_url, LLMQ_HEARTBEAT_SECONDS="0.2", LLMQ_ORPHAN_GRACE_SECONDS="1"
    )
    lines = [chat_line(f"l{i}", f"line {i} asks", max_tokens=30 + i) for i in range(16)]
    try:
        async with httpx.AsyncClient(base_url=url, timeout=10) as a:
            await wait_ready(a, timeout=30, path="/healthz")
        first = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused")
        async with first:
            batch = await create(first, lines)

            async def feeder_leased() -> bool:  # taken once there is a batch to feed
                return await redis.get(keys.BATCH_FEEDER) is not None

            await wait_until(feeder_leased, timeout=10, what="the first API to take the lease")

            async def some_done() -> bool:
                got = await first.batches.retrieve(batch.id)
                return got.request_counts is not None and got.request_counts.completed >= 3

            await wait_until(some_done, timeout=30, what="three lines to finish")
        procs[0].popen.kill()
        feeding.popen.kill()
        survivor = await start_api(heartbeat_seconds=0.2, orphan_grace_seconds=1)
        async with survivor.sdk() as client:
            done = (await finished(client, batch.id, timeout=90))[-1]
            output = by_custom_id((await client.files.content(done.output_file_id)).text)
            alone = {
                line["custom_id"]: await client.chat.completions.create(**line["body"])
                for line in lines
            }
    finally:
        feeding.stop()
    assert done.status == "completed", done
    assert done.error_file_id is None
    assert sorted(output) == sorted(line["custom_id"] for line in lines)
    assert done.request_counts is not None and done.request_counts.completed == len(lines)
    for custom_id, line in output.items():
        body = line["response"]["body"]
        expected = alone[custom_id]
        assert body["choices"][0]["message"]["content"] == expected.choices[0].message.content
        assert body["usage"]["completion_tokens"] == expected.usage.completion_tokens


async def test_a_stopped_feeding_api_hands_its_batch_over_and_fails_no_line(
    start_api: StartApi, start_worker: StartWorker, redis_url: str, redis: Redis
) -> None:
    """SIGTERM to the API process feeding a batch of 300 short lines while a client
    stream is open on it (so it stops only after its streams' grace): it gives the
    lease up at once and records none of the lines it was collecting; another API
    process takes over at once (the first one's lease, 30 s long, does not lapse
    meanwhile) and collects them. No line is in the error file, every custom_id is in
    the output once, and the client stream ends as documented (``shutting_down``)."""
    await start_worker(concurrency=3)
    url, feeding = start_api_process(
        redis_url, LLMQ_ORPHAN_GRACE_SECONDS="30", LLMQ_SHUTDOWN_GRACE_SECONDS="2"
    )
    lines = [chat_line(f"s{i}", f"short {i}", max_tokens=4) for i in range(300)]
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30) as a:
            await wait_ready(a, timeout=30, path="/healthz")
            started = asyncio.Event()
            live = asyncio.create_task(stream_completion(a, 2000, started))
            async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused") as sdk:
                batch = await create(sdk, lines)

            async def some_done() -> bool:
                done = await redis.hget(keys.batch(batch.id), "completed")  # type: ignore[misc]
                return started.is_set() and int(done or 0) >= 20

            await wait_until(some_done, timeout=30, what="the stream and 20 lines")
            feeding.signal(signal.SIGTERM)
            survivor = await start_api()
            _, stream_errors = await live
        assert await asyncio.to_thread(feeding.wait, 15) in (
            0,
            -signal.SIGTERM,
        )  # uvicorn re-raises it
        async with survivor.sdk() as client:
            done = (await finished(client, batch.id, timeout=20))[-1]
            errors = (
                (await client.files.content(done.error_file_id)).text if done.error_file_id else ""
            )
            output = by_custom_id((await client.files.content(done.output_file_id)).text)
    finally:
        feeding.stop()
    assert [e["code"] for e in stream_errors] == ["shutting_down"]
    assert done.status == "completed", done
    assert errors == "", errors.splitlines()[:3]
    assert sorted(output) == sorted(line["custom_id"] for line in lines)
    assert done.request_counts is not None and done.request_counts.failed == 0


async def test_every_line_once_and_exact_across_a_redis_restart(
    own_redis: EmbeddedRedis, start_api: StartApi, start_worker: StartWorker
) -> None:
    """Redis SIGKILLed mid-batch and started again from its AOF: the batch, its lines
    and the results recorded so far come back, and the batch completes with each line
    once, as the request alone answers it."""
    fast_fail = {"redis_pool_timeout_seconds": 1.0, "redis_socket_timeout_seconds": 1.0}
    await start_worker(redis_url=own_redis.url, model_tokens_per_second=100, **fast_fail)
    api = await start_api(redis_url=own_redis.url, relay_block_ms=500, **fast_fail)
    lines = [chat_line(f"r{i}", f"line {i} asks", max_tokens=20 + i) for i in range(12)]
    async with api.sdk() as client:
        batch = await create(client, lines)

        async def some_done() -> bool:
            got = await client.batches.retrieve(batch.id)
            return got.request_counts is not None and got.request_counts.completed >= 2

        await wait_until(some_done, timeout=30, what="two lines to finish")
        own_redis.kill()
        own_redis.start()
        seen: list[Any] = []

        async def ended() -> bool:  # errors while the processes reconnect
            with contextlib.suppress(openai.APIError):
                seen.append(await client.batches.retrieve(batch.id))
            return bool(seen) and seen[-1].status in ("completed", "failed", "expired")

        await wait_until(ended, timeout=90, what="the batch to end", interval=0.1)
        done = seen[-1]
        assert done.status == "completed", done
        output = by_custom_id((await client.files.content(done.output_file_id)).text)
        alone = {
            line["custom_id"]: await client.chat.completions.create(**line["body"])
            for line in lines
        }
    assert done.error_file_id is None
    assert sorted(output) == sorted(line["custom_id"] for line in lines)
    assert done.request_counts is not None and done.request_counts.completed == len(lines)
    for custom_id, line in output.items():
        body = line["response"]["body"]
        assert body["choices"][0]["message"]["content"] == (
            alone[custom_id].choices[0].message.content
        )
