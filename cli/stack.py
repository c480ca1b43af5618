"""``llmq run``: the whole stack as local processes, supervised, stopped in order.

Starts Redis (embedded unless ``LLMQ_REDIS_URL`` is set), one API process and the
workers (``--workers N``, or ``--autoscale MIN:MAX``: ``MIN`` at start and an
autoscaler that adds and removes workers; or ``--upstream URL``, repeated: one
worker per inference server, which it finds out about itself), all under one
:class:`~cli.supervisor.Supervisor`: a child that dies is restarted with backoff,
a crash loop stops the stack with exit code 1.

Ctrl-C (SIGINT to the terminal's process group) or SIGTERM stops, in order: the
autoscaler, the workers (they drain: running requests finish or go back to the
queue), the API (it ends each open stream with its tokens or an error chunk, then
``[DONE]``, and flushes its metrics), and the embedded Redis last. Every child and
the embedded Redis run in their own session, so the terminal's signal reaches
only this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os

import httpx

from cli.api_processes import api_commands
from cli.local_driver import LocalDriver
from cli.supervisor import Child, RestartPolicy, Supervisor, llmq_command, stop_signals
from llmq.autoscale.controller import Controller
from llmq.connection import connect
from llmq.embedded import EmbeddedRedis
from llmq.settings import RunSettings

log = logging.getLogger(__name__)


async def _announce_when_ready(url: str) -> None:
    async with httpx.AsyncClient(timeout=1.0) as client:
        for _ in range(600):
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(url + "/readyz")).status_code == 200:
                    log.info("llmq is ready at %s (Ctrl-C stops everything)", url)
                    return
            await asyncio.sleep(0.1)
        log.warning("llmq is not ready after 60s; see the logs above")


class Stack:
    """The stack's processes; ``run`` owns them from start to the ordered stop."""

    def __init__(self, settings: RunSettings) -> None:
        self.settings = settings
        self.supervisor = Supervisor(
            RestartPolicy(
                limit=settings.restart_limit,
                window_seconds=settings.restart_window_seconds,
                backoff_seconds=settings.restart_backoff_seconds,
            )
        )
        self._numbers = itertools.count(1)
        self.workers: list[Child] = []
        self.env: dict[str, str] = {}

    async def add_worker(self, upstream: str | None = None) -> Child:
        """A worker of the mock, or of the inference server at ``upstream``."""
        env = self.env
        if upstream is not None:
            env = {**env, "LLMQ_BACKEND": "openai", "LLMQ_UPSTREAM_URL": upstream}
        child = await self.supervisor.start(
            f"worker-{next(self._numbers)}", llmq_command("worker"), env
        )
        self.workers.append(child)
        return child

    async def run(self) -> int:
        settings = self.settings
        stop = stop_signals()

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
        self.env = {
            **os.environ,
            "LLMQ_REDIS_URL": redis_url,
            "LLMQ_HOST": settings.host,
            "LLMQ_PORT": str(settings.port),
            "LLMQ_CONCURRENCY": str(settings.concurrency),
            "LLMQ_MODEL": settings.model,
            "LLMQ_API_PROCESSES": str(settings.api_processes),
            "PYTHONUNBUFFERED": "1",
        }
        bounds = settings.bounds
        api: list[Child] = []
        controller_task: asyncio.Task[None] | None = None
        controller_stop = asyncio.Event()
        driver: LocalDriver | None = None
        code = 0
        try:
            for name, argv in api_commands(settings.api_processes):
                api.append(await self.supervisor.start(name, argv, self.env))
            for url in settings.upstream_urls:
                await self.add_worker(url)
            for _ in range(0 if settings.upstreams else bounds[0] if bounds else settings.workers):
                await self.add_worker()
            if bounds is not None:
                driver = LocalDriver(self.supervisor, self.add_worker)
                for child in self.workers:
                    driver.adopt(child)
                controller_task = asyncio.create_task(
                    self._control(redis_url, driver, bounds, controller_stop)
                )
            announce = asyncio.create_task(
                _announce_when_ready(f"http://{settings.host}:{settings.port}")
            )
            failure = await self.supervisor.until_stopped(stop)
            announce.cancel()
            if failure is not None:
                log.error("llmq run stops: %s", failure)
                code = 1
        finally:
            if controller_task is not None:
                controller_stop.set()
                await controller_task
            if driver is not None:
                await driver.close()
            await self.supervisor.stop([c for c in self.workers if not c.ended.is_set()])
            await self.supervisor.stop(api)
            await self.supervisor.close()
            if redis is not None:
                await asyncio.to_thread(redis.stop)
                log.info("embedded redis-server stopped")
            log.info("llmq stopped")
        return code

    async def _control(
        self,
        redis_url: str,
        driver: LocalDriver,
        bounds: tuple[int, int],
        stop: asyncio.Event,
    ) -> None:
        settings = self.settings.model_copy(update={"redis_url": redis_url})
        redis = connect(settings, max_connections=4)
        try:
            controller = Controller(
                redis,
                settings,
                [settings.model],
                driver,
                bounds=bounds,
                concurrency=settings.concurrency,
            )
            await controller.run(stop)
        except Exception:
            log.exception("the autoscaler failed; the workers stay as they are")
        finally:
            await redis.aclose(close_connection_pool=True)


async def run_stack(settings: RunSettings) -> int:
    return await Stack(settings).run()
