"""The local driver: scale-in is SIGTERM and the worker's drain, so no stream is cut."""

from __future__ import annotations

import asyncio
import io
import itertools
import subprocess
import sys
import time

import pytest
from redis.asyncio import Redis

from cli.local_driver import LocalDriver, stop_first
from cli.supervisor import Child, RestartPolicy, Supervisor
from llmq import registry
from llmq.protocol import keys
from llmq.schema import WorkerInfo
from tests.support.processes import clean_env
from tests.support.servers import FAST_MODEL, StartApi
from tests.support.sse import stream_completion
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

TOKENS = 300  # 3 s at 100 tokens/s: longer than the drain


@pytest.mark.slow
async def test_scale_in_under_running_streams_cuts_none(
    redis_url: str, redis: Redis, start_api: StartApi
) -> None:
    out = io.BytesIO()
    supervisor = Supervisor(RestartPolicy(), out=out)
    env = clean_env(
        LLMQ_REDIS_URL=redis_url,
        LLMQ_CONCURRENCY="1",
        LLMQ_DRAIN_SECONDS="0.5",
        LLMQ_HEARTBEAT_SECONDS="0.2",
        LLMQ_MODEL_PREFILL_SECONDS_PER_TOKEN=str(FAST_MODEL["model_prefill_seconds_per_token"]),
        LLMQ_MODEL_TOKENS_PER_SECOND="100",
    )
    numbers = itertools.count(1)

    async def spawn() -> Child:
        return await supervisor.start(
            f"worker-{next(numbers)}", [sys.executable, "-m", "cli", "worker"], env
        )

    driver = LocalDriver(supervisor, spawn)
    api = await start_api()
    try:
        ordered = time.monotonic()
        await driver.scale("mock", 2, ())
        assert driver.starting("mock", ()) == 2

        async def registered() -> bool:
            return int(await redis.zcard(keys.WORKERS)) == 2

        await wait_until(registered, timeout=30, what="two workers")
        seen = time.monotonic() - ordered
        # measured to the worker's registration, not to when the driver noticed it
        assert driver.starting("mock", tuple(await registry.live_workers(redis, 5.0))) == 0
        startup = driver.startup_seconds()
        assert startup is not None and 0 < startup < seen
        async with api.client() as client:
            started = [asyncio.Event(), asyncio.Event()]
            streams = [asyncio.create_task(stream_completion(client, TOKENS, e)) for e in started]
            for event in started:
                async with asyncio.timeout(20):
                    await event.wait()

            async def both_busy() -> bool:  # as the registry reports it (heartbeat)
                workers = await registry.live_workers(redis, 5.0)
                return sorted(w.running for w in workers) == [1, 1]

            await wait_until(both_busy, timeout=10, what="each worker to run a stream")
            live = tuple(await registry.live_workers(redis, 5.0))
            assert driver.starting("mock", live) == 0
            await driver.scale("mock", 1, live)  # the victim is running a stream
            results = await asyncio.gather(*streams)
        assert [(len(text.split()), errors) for text, errors in results] == [(TOKENS, [])] * 2
        log = out.getvalue().decode()
        assert "handed back to the queue" in log, log[-3000:]
        assert len(driver.active()) == 1

        async def released() -> bool:  # just after the last event, by its worker
            return int(await redis.zcard(keys.running("mock"))) == 0

        await wait_until(released, timeout=5, what="the running set to empty")
    finally:
        await driver.close()
        await supervisor.close()


def test_a_worker_start_does_not_import_the_load_generator() -> None:
    """numpy and the loadgen package cost about 0.3 s of CPU, paid by every worker a
    scale-up starts, for flags that only ``llmq loadgen`` has."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "cli", "worker", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines()}
    assert "llmq worker" in out.stdout.replace("usage: llmq worker", "llmq worker")
    assert not imported & {"numpy", "loadgen"}, sorted(imported & {"numpy", "loadgen"})


def test_scale_in_stops_the_worker_whose_cache_is_worth_least_first() -> None:
    def info(wid: str, hits: int, running: int) -> WorkerInfo:
        return WorkerInfo(
            id=wid,
            host="h",
            pid=1,
            model="mock",
            concurrency=8,
            running=running,
            started_at=0.0,
            heartbeat_at=0.0,
            prefix_cache_hits=hits,
        )

    workers = {
        "warm-idle": stop_first(info("warm-idle", 9000, 0), 1.0),
        "cold-busy": stop_first(info("cold-busy", 10, 5), 2.0),
        "cold-idle": stop_first(info("cold-idle", 10, 1), 3.0),
        "starting": stop_first(None, 4.0),
    }
    assert sorted(workers, key=workers.__getitem__) == [
        "starting",
        "cold-idle",
        "cold-busy",
        "warm-idle",
    ]
