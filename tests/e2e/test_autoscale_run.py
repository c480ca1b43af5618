"""``llmq run --autoscale 1:6`` under a step load: up, back down, no request failed.

(Scale-in under a running stream, deterministically: ``tests/test_local_driver.py``.)
"""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest
from redis.asyncio import Redis

from llmq.protocol import keys
from tests.support.processes import children_of, live_workers, reap, start_run, wait_for
from tests.support.sse import stream_completion
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

TOKENS = 150  # 1.5 s at 100 tokens/s


async def test_step_load_scales_up_and_back_down_with_no_failed_request() -> None:
    url, proc = start_run(
        "--autoscale",
        "1:6",
        "--concurrency",
        "2",
        LLMQ_MODEL_TOKENS_PER_SECOND="100",
        LLMQ_MODEL_LOAD_SECONDS="1",
        LLMQ_SCALE_DOWN_WINDOW_SECONDS="2",
        LLMQ_HEARTBEAT_SECONDS="0.2",
    )
    kids: list[int] = []
    try:
        wait_for(lambda: live_workers(url) == 1, 60, "the first worker", proc)
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            # the step: from nothing to 8 requests/s (12 busy slots; one worker has 2)
            streams = []
            for _ in range(24):
                streams.append(
                    asyncio.create_task(stream_completion(client, TOKENS, asyncio.Event()))
                )
                await asyncio.sleep(0.125)
            peak = 0

            def count() -> bool:
                nonlocal peak
                peak = max(peak, live_workers(url))
                return all(s.done() for s in streams)

            await wait_until(count, timeout=60, what="every stream to end", interval=0.2)
            results = [s.result() for s in streams]
        assert all(errors == [] for _, errors in results), [e for _, e in results if e]
        assert [len(text.split()) for text, _ in results] == [TOKENS] * 24
        assert peak >= 4, f"scaled up to {peak} workers only"
        wait_for(lambda: live_workers(url) == 1, 60, "the scale-down to MIN", proc)
        out = proc.output()
        downs = re.findall(r"scale mock down: (\d+) -> (\d+) workers", out)
        assert len(downs) >= 3 and all(int(b) == int(a) - 1 for a, b in downs), downs
        kids = children_of(proc.pid)
        redis_url = re.search(r"embedded redis-server \(.*\) on (\S+)", out)
        assert redis_url is not None
        redis = Redis.from_url(redis_url.group(1), decode_responses=True)
        try:
            assert await redis.zcard(keys.queue("mock")) == 0
            assert await redis.zcard(keys.running("mock")) == 0
        finally:
            await redis.aclose()
    finally:
        proc.stop()
        reap(kids)
