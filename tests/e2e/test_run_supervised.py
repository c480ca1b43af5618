"""``llmq run`` as a process manager: restarts, crash loops, and Ctrl-C in order."""

from __future__ import annotations

import asyncio
import os
import signal

import httpx
import pytest

from tests.support.processes import (
    alive,
    children_of,
    http_status,
    live_workers,
    logged_restart,
    reap,
    start_run,
    wait_for,
)
from tests.support.sse import stream_completion

pytestmark = [pytest.mark.timeout(90), pytest.mark.slow]


async def test_a_killed_worker_is_restarted_and_its_request_completes() -> None:
    url, proc = start_run("--workers", "1", LLMQ_MODEL_TOKENS_PER_SECOND="100")
    kids: list[int] = []
    try:
        wait_for(lambda: live_workers(url) == 1, 60, "a live worker", proc)
        kids = children_of(proc.pid)
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            worker_pid = (await client.get("/v1/workers")).json()["data"][0]["pid"]
            started = asyncio.Event()
            streaming = asyncio.create_task(stream_completion(client, 300, started))
            async with asyncio.timeout(20):
                await started.wait()
            os.kill(worker_pid, signal.SIGKILL)
            text, errors = await streaming
        assert errors == [] and len(text.split()) == 300
        out = proc.output()
        assert logged_restart(out, "worker-1", worker_pid), out[-3000:]
        assert proc.popen.poll() is None, "the stack must survive a worker's death"
        # the killed worker leaves the registry once its heartbeat is LLMQ_WORKER_TTL_SECONDS old
        wait_for(lambda: live_workers(url) == 1, 15, "only the restarted worker live", proc)
    finally:
        proc.stop()
        reap(kids + children_of(proc.pid))


def test_a_crash_loop_stops_the_stack_with_a_clear_error() -> None:
    # a worker setting that only the worker rejects: it exits 2 at every start
    _, proc = start_run(
        "--workers",
        "1",
        "--restart-limit",
        "2",
        "--restart-backoff-seconds",
        "0.05",
        LLMQ_MODEL_TOKENS_PER_SECOND="-1",
    )
    try:
        assert proc.wait(60) == 1
        out = proc.output()
        assert "worker-1" in out and "exit status 2" in out
        assert "crash loop, stopping the stack" in out and "llmq run stops" in out
        assert "llmq stopped" in out
    finally:
        proc.stop()


async def test_ctrl_c_stops_in_order_and_ends_every_stream_cleanly() -> None:
    """SIGINT to the whole process group, as a terminal sends it, with streams in flight."""
    url, proc = start_run(
        "--workers",
        "1",
        LLMQ_MODEL_TOKENS_PER_SECOND="50",
        LLMQ_DRAIN_SECONDS="1.5",
        LLMQ_SHUTDOWN_GRACE_SECONDS="0.5",
    )
    kids: list[int] = []
    try:
        wait_for(lambda: live_workers(url) == 1, 60, "a live worker", proc)
        kids = children_of(proc.pid)
        assert len(kids) == 3, kids  # redis-server, api, worker
        # Each child, the embedded Redis included, runs outside the terminal's group.
        assert all(os.getsid(k) == k for k in kids)
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            short_started, long_started = asyncio.Event(), asyncio.Event()
            short = asyncio.create_task(stream_completion(client, 40, short_started))
            long = asyncio.create_task(stream_completion(client, 2000, long_started))
            async with asyncio.timeout(20):
                await short_started.wait()
                await long_started.wait()
            os.killpg(proc.pid, signal.SIGINT)
            short_text, short_errors = await short
            long_text, long_errors = await long
        # the short one finished while its worker drained; the long one went back to
        # the queue and the API ended its stream with an error chunk, then [DONE]
        assert short_errors == [] and len(short_text.split()) == 40
        assert [e["code"] for e in long_errors] == ["shutting_down"]
        assert 0 < len(long_text.split()) < 2000
        assert await asyncio.to_thread(proc.wait, 30) == 0
        wait_for(lambda: not any(alive(k) for k in kids), 10, "children to exit")
        out = proc.output()
        assert "Traceback" not in out and " ERROR " not in out, out[-3000:]
        api_done = out.index("[api]", out.index("Application shutdown complete"))
        worker_done = out.index("stopped", out.index("[worker-1]", out.index("stopping")))
        redis_done = out.index("embedded redis-server stopped")
        assert worker_done < api_done < redis_done < out.index("llmq stopped")
    finally:
        proc.stop()
        reap(kids)


def test_api_processes_run_as_children_of_the_stack() -> None:
    """``llmq run --api-processes 2``: two API processes on the port, each a child
    of the stack's own supervisor (not a supervisor of its own), stopped with it."""
    url, proc = start_run("--workers", "0", "--api-processes", "2")
    kids: list[int] = []
    try:
        wait_for(lambda: http_status(url + "/healthz") == 200, 60, "the API", proc)
        wait_for(lambda: "[api-2]" in proc.output(), 30, "the second API process", proc)
        kids = children_of(proc.pid)
        assert len(kids) == 3, kids  # redis-server, api-1, api-2
        assert not any(children_of(k) for k in kids)
        assert proc.stop(timeout=30) == 0
        wait_for(lambda: not any(alive(k) for k in kids), 10, "children to exit")
    finally:
        proc.stop()
        reap(kids)
