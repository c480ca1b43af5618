"""``llmq run``: the whole stack as local processes, stopped as one.

Starts Redis (embedded unless ``LLMQ_REDIS_URL`` is set), one API process and N
workers, each a child in its own session so that Ctrl-C reaches only the
supervisor, which then stops the children in order (workers drain, API closes)
and the embedded Redis last. Every child's output is prefixed by its name. If a
child dies on its own, the whole stack stops with a non-zero exit code: a
half-running stack is worse than a clear failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from dataclasses import dataclass

import httpx

from llmq.embedded import EmbeddedRedis
from llmq.settings import RunSettings

log = logging.getLogger(__name__)

STOP_TIMEOUT = 20.0


@dataclass
class Child:
    name: str
    process: asyncio.subprocess.Process
    pump: asyncio.Task[None]


async def _pump(name: str, stream: asyncio.StreamReader) -> None:
    prefix = f"[{name}] ".encode()
    out = sys.stdout.buffer
    while line := await stream.readline():
        out.write(prefix + line)
        out.flush()


async def _spawn(name: str, args: list[str], env: dict[str, str]) -> Child:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "llmq",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    if process.stdout is None:  # pragma: no cover - PIPE always gives a reader
        raise RuntimeError("child has no stdout")
    return Child(name, process, asyncio.create_task(_pump(name, process.stdout)))


async def _stop(children: list[Child]) -> None:
    for child in children:
        if child.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                child.process.send_signal(signal.SIGTERM)
    for child in children:
        try:
            async with asyncio.timeout(STOP_TIMEOUT):
                await child.process.wait()
        except TimeoutError:
            log.warning("%s did not stop in %.0fs; killing it", child.name, STOP_TIMEOUT)
            with contextlib.suppress(ProcessLookupError):
                child.process.kill()
            await child.process.wait()
        await child.pump


async def _announce_when_ready(url: str) -> None:
    async with httpx.AsyncClient(timeout=1.0) as client:
        for _ in range(600):
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(url + "/readyz")).status_code == 200:
                    log.info("llmq is ready at %s (Ctrl-C stops everything)", url)
                    return
            await asyncio.sleep(0.1)
        log.warning("llmq is not ready after 60s; see the logs above")


async def run_stack(settings: RunSettings) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    embedded = settings.embedded_redis
    if embedded is None:
        embedded = "LLMQ_REDIS_URL" not in os.environ
    redis: EmbeddedRedis | None = None
    redis_url = settings.redis_url
    if embedded:
        redis = EmbeddedRedis()
        await asyncio.to_thread(redis.start)
        redis_url = redis.url
        log.info("embedded redis-server (%s) on %s", redis.binary, redis_url)

    env = {
        **os.environ,
        "LLMQ_REDIS_URL": redis_url,
        "LLMQ_HOST": settings.host,
        "LLMQ_PORT": str(settings.port),
        "LLMQ_CONCURRENCY": str(settings.concurrency),
        "PYTHONUNBUFFERED": "1",
    }
    workers: list[Child] = []
    api: list[Child] = []
    code = 0
    try:
        api.append(await _spawn("api", ["api"], env))
        for i in range(settings.workers):
            workers.append(await _spawn(f"worker-{i + 1}", ["worker"], env))
        announce = asyncio.create_task(
            _announce_when_ready(f"http://{settings.host}:{settings.port}")
        )
        waits = {asyncio.create_task(c.process.wait()): c for c in api + workers}
        stopper = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait({stopper, *waits}, return_when=asyncio.FIRST_COMPLETED)
        announce.cancel()
        for task in done:
            if task in waits:
                child = waits[task]
                log.error("%s exited with code %s; stopping", child.name, child.process.returncode)
                code = 1
        stopper.cancel()
        for task in waits:
            task.cancel()
    finally:
        await _stop(workers)
        await _stop(api)
        if redis is not None:
            await asyncio.to_thread(redis.stop)
        log.info("llmq stopped")
    return code
