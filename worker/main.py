"""The worker process: wiring, background tasks and a graceful shutdown.

``serve`` owns every resource and task it starts: the Redis pool, the stream
publisher, the wake-up listener, the registry heartbeat and the arq worker.
SIGTERM/SIGINT stop claiming at once; running requests get ``drain`` seconds to
finish, then whatever is left is cancelled and handed back to the queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
import time
from typing import NoReturn, cast

from arq.connections import ArqRedis
from redis.asyncio import Redis

from llmq import metrics, registry
from llmq.connection import connect_cluster, is_cluster, make_pool, slot_pool
from llmq.model.interface import (
    Backend,
    KVCacheUsage,
    context_length_of,
    prefix_cache_of,
    tokenizer_of,
)
from llmq.outage import Outage
from llmq.policy import live as live_policy
from llmq.protocol import keys
from llmq.protocol.queue import Queue, as_str, parse_handoff
from llmq.protocol.sweep import sweep_forever
from llmq.schema import WorkerInfo
from llmq.settings import WorkerSettings
from llmq.tasks import run_periodically, stop_tasks
from worker import backends
from worker.backends.openai import OpenAIUpstream
from worker.backends.watch import UpstreamWatch
from worker.cache_report import CacheReport
from worker.leases import LeaseClock
from worker.publisher import StreamPublisher
from worker.queue_worker import ClaimingRedis, QueueWorker
from worker.runner import RequestRunner

log = logging.getLogger(__name__)


def new_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


#: How long one read of the pub/sub connection waits: an idle listener loops on
#: this instead of blocking on the socket, whose timeout would cut it every few seconds.
LISTEN_SECONDS = 1.0


async def _listen(redis: ArqRedis, model: str, worker: QueueWorker) -> None:
    """Wake-ups, cancels and hand-offs for this worker, on one pub/sub connection.

    Reads with a timeout shorter than the socket's, so an idle connection is never
    cut (the pool's health checks PING it). Reconnects with backoff if Redis goes
    away, logged once per outage; after a reconnect the worker polls once, since a
    wake-up may have been missed meanwhile, and a missed cancel is found by the next
    lease renewal (the cancel flag). The worker parks (and so can be handed
    requests) only through that poll, after its channel is subscribed. On a Redis
    Cluster the connection goes to the node that owns the model's slot, where the
    enqueue script publishes, and after a failover to its successor
    (:class:`llmq.connection.SlotPool`).
    """
    wake_channel, cancel_channel = keys.wake(model), keys.cancel_channel(model)
    handoff_channel = keys.handoff(worker.worker_id, model)
    outage = Outage(
        log,
        lost="wake-up listener lost Redis (%s); reconnecting",
        back="wake-up listener is back after %d failed attempts",
    )
    while True:
        try:
            async with redis.pubsub(ignore_subscribe_messages=True) as pubsub:
                await pubsub.subscribe(wake_channel, cancel_channel, handoff_channel)
                outage.recovered()
                worker.woken("")  # wake-ups may have been missed meanwhile
                while True:
                    message = await pubsub.get_message(timeout=LISTEN_SECONDS)
                    if message is None or message.get("type") != "message":
                        continue
                    channel = as_str(message["channel"])
                    if channel == handoff_channel:
                        await _handoff(worker, message["data"])
                    elif channel == cancel_channel:
                        worker.runner.cancel(as_str(message["data"]))
                    else:
                        worker.woken(as_str(message["data"]))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await outage.failed(exc)


async def _handoff(worker: QueueWorker, data: bytes) -> None:
    try:
        claim = parse_handoff(data)
    except ValueError:
        log.error("ignoring a malformed hand-off message: %r", data[:200])
        return
    await worker.take_handoff(claim)


def _kv_usage(backend: Backend) -> float | None:
    return round(backend.kv_usage(), 4) if isinstance(backend, KVCacheUsage) else None


async def _heartbeat(
    redis: Redis,
    settings: WorkerSettings,
    worker: QueueWorker,
    worker_id: str,
    cache: CacheReport,
    watch: UpstreamWatch | None = None,
) -> NoReturn:
    """Registry entry and request leases, renewed together every heartbeat.

    The renewal brings news: a request this worker lost (its lease was reaped) is
    stopped without writing; a cancelled one is cancelled, even if this worker
    missed the cancel message. The entry declares the model (capabilities, the
    tokenizer the API counts with, the context length) and whether its upstream
    answers (``watch``). Under a routing policy the beat also publishes the worker's
    load and what its KV cache gained and lost (:mod:`worker.cache_report`).
    """
    runner = worker.runner
    lease_ms = int(settings.lease_seconds * 1000)
    started_at = time.time()

    async def beat() -> None:
        info = WorkerInfo(
            id=worker_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            model=settings.model,
            concurrency=worker.max_jobs,
            running=len(runner.runs),
            started_at=started_at,
            heartbeat_at=time.time(),
            capabilities=runner.capabilities(),
            kv_cache_usage=_kv_usage(runner.backend),
            prefix_cache_queries=runner.cache_queries,
            prefix_cache_hits=runner.cache_hits,
            tokenizer=tokenizer_of(runner.backend),
            context_length=context_length_of(runner.backend),
            prefix_cache=prefix_cache_of(runner.backend),
            ready=watch is None or watch.ready,
            upstream=backends.upstream_found(runner.backend),
            draining=worker.draining,
        )
        produced, sent_at = runner.produced(), asyncio.get_running_loop().time()
        news = await worker.queue.renew(settings.model, worker.held, lease_ms, worker_id)
        await registry.heartbeat(redis, info, settings.worker_ttl_seconds)
        if not worker.draining and await registry.drained(redis, worker_id):
            await worker.drain()
        if worker.queue.routing_for(settings.model).routed:
            await cache.publish(
                worker.queue,
                settings.model,
                worker_id,
                running=worker.busy_slots,
                capacity=worker.max_jobs,
                ttl_ms=int(settings.worker_ttl_seconds * 1000),
                pace=runner.pace.now(),
            )
        for rid, renewal in news.items():
            if renewal == "lost":
                runner.fence(rid)
            elif renewal == "cancelled":
                runner.cancel(rid)
            if renewal == "ok":
                if rid in produced:
                    runner.renewed(rid, sent_at, produced[rid])
                runner.resume(rid)  # a generation paused by the lease clock goes on

    await run_periodically(beat, settings.heartbeat_seconds, what="heartbeat", logger=log)


#: How often the worker checks its leases against its own clock.
LEASE_CHECK_SECONDS = 0.05


async def _expire_leases(runner: RequestRunner, settings: WorkerSettings) -> NoReturn:
    """Stop runs whose lease would have expired by this process's clock; apart from
    the heartbeat, which may be stuck on a Redis that does not answer."""

    async def check() -> None:
        runner.expire_leases()

    interval = min(LEASE_CHECK_SECONDS, settings.heartbeat_seconds)
    await run_periodically(check, interval, what="lease expiry", logger=log)


async def serve(
    settings: WorkerSettings, *, stop: asyncio.Event | None = None, backend: Backend | None = None
) -> None:
    """Run a worker until ``stop`` is set (or SIGTERM/SIGINT arrives)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
    if not await _load(settings, stop):
        return
    backend = backend or backends.build_backend(settings)
    try:
        if await backends.connect(backend, stop):
            await _serve(settings, stop, backend)
    finally:
        await backends.close(backend)


async def _serve(settings: WorkerSettings, stop: asyncio.Event, backend: Backend) -> None:
    """The worker's resources and tasks around ``backend`` (connected), until ``stop``."""
    worker_id = new_worker_id()
    # On a Redis Cluster the arq pool and the pub/sub listener talk to the node that
    # owns the model's slot (where the enqueue script publishes hand-offs), while
    # everything else goes through the cluster client, routed by slot.
    cluster = connect_cluster(settings, decode_responses=False) if is_cluster(settings) else None
    pool = (
        await slot_pool(settings, cluster, keys.queue(settings.model), decode_responses=False)
        if cluster is not None
        else make_pool(settings, decode_responses=False)
    )
    redis = ClaimingRedis(
        pool_or_conn=pool,
        job_serializer=None,
        job_deserializer=None,
        default_queue_name=keys.queue(settings.model),
    )
    store = cast(Redis, cluster) if cluster is not None else redis
    tally = metrics.Tally()
    tally.inc(metrics.WORKER_STARTS, settings.model)  # a crash loop shows as starts
    policy = await live_policy.start(store, settings, worker_id, derived=True)
    publisher = StreamPublisher(
        store,
        maxlen=settings.stream_maxlen,
        ttl_seconds=settings.request_ttl_seconds,
        max_event_tokens=settings.max_event_tokens,
        lifecycle_maxlen=settings.lifecycle_maxlen,
        lifetimes=policy.pool,
    )
    cache = CacheReport(backend)
    runner = RequestRunner(
        worker_id,
        backend,
        publisher,
        embedder=backends.embedder_for(backend, settings),
        metrics=tally,
        model=settings.model,
        max_tries=settings.max_tries,
        job_timeout=settings.job_timeout_seconds,
        leases=LeaseClock(
            settings.lease_seconds,
            settings.lease_margin_seconds,
            enabled=settings.lease_self_expiry,
        ),
        trace_attributes=lambda: {
            "llmq.routing": policy.of(settings.model).routing,
            "llmq.fairness": policy.of(settings.model).fairness,
        },
    )
    queue = Queue(
        store,
        stream_maxlen=settings.stream_maxlen,
        ttl_seconds=settings.request_ttl_seconds,
        tally=tally,
        lifecycle_maxlen=settings.lifecycle_maxlen,
        policy=policy,
    )
    worker = QueueWorker(
        model=settings.model,
        worker_id=worker_id,
        runner=runner,
        redis=redis,
        queue=queue,
        token_budget=settings.worker_token_budget,
        max_tries=settings.max_tries,
        max_jobs=backends.concurrency(backend, settings),
        poll_seconds=settings.poll_seconds,
        job_timeout=settings.job_timeout_seconds,
        lease_seconds=settings.lease_seconds,
    )
    watch = None
    if isinstance(backend, OpenAIUpstream):
        watch = UpstreamWatch(
            backend, worker, queue, interval=settings.upstream_probe_seconds, stop=stop
        )
    publisher.start()
    tasks = [
        asyncio.create_task(
            _heartbeat(store, settings, worker, worker_id, cache, watch), name="heartbeat"
        ),
        asyncio.create_task(_listen(redis, settings.model, worker), name="pubsub"),
        asyncio.create_task(
            sweep_forever(queue, settings.sweep_seconds, reap=(settings.model,)), name="sweep"
        ),
        asyncio.create_task(metrics.flush_forever(tally, store), name="metrics-flush"),
        asyncio.create_task(_expire_leases(runner, settings), name="lease-expiry"),
        asyncio.create_task(policy.follow_forever(), name="policy-follow"),
    ]
    if watch is not None:
        tasks.append(asyncio.create_task(watch.run(), name="upstream-watch"))
    main = asyncio.create_task(worker.main(), name="claim-loop")
    log.info(
        "worker %s serving model %r, concurrency %d",
        worker_id,
        settings.model,
        worker.max_jobs,
    )
    stopping = asyncio.create_task(stop.wait(), name="stop")
    try:
        # The claim loop only ends on a bug; then the worker exits rather than idle.
        await asyncio.wait({stopping, main}, return_when=asyncio.FIRST_COMPLETED)
        if main.done() and not main.cancelled() and main.exception() is not None:
            log.error("claim loop failed; stopping the worker", exc_info=main.exception())
    finally:
        stopping.cancel()
        log.info("worker %s stopping: draining %d running", worker_id, len(worker.tasks))
        worker.allow_pick_jobs = False
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2):
                await queue.unpark(settings.model, worker_id)
                if queue.routing_for(settings.model).routed:
                    await queue.forget_worker(settings.model, worker_id)
        await _drain(worker, settings.drain_seconds)
        await stop_tasks([main, *tasks], timeout=5)
        await metrics.final_flush(tally, store)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2):
                await registry.unregister(store, worker_id)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                await publisher.stop(timeout=5)
        await redis.aclose(close_connection_pool=True)
        if cluster is not None:
            await cluster.aclose()
        log.info("worker %s stopped", worker_id)


async def _load(settings: WorkerSettings, stop: asyncio.Event) -> bool:
    """The model's load time, before the worker registers: False if stopped meanwhile."""
    if settings.model_load_seconds > 0:
        log.info("loading model %r (%.1fs)", settings.model, settings.model_load_seconds)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(settings.model_load_seconds):
                await stop.wait()
    return not stop.is_set()


async def _drain(worker: QueueWorker, seconds: float) -> None:
    """Let running requests finish for ``seconds``, then cancel (and so re-queue) the rest."""
    running = [t for t in worker.tasks.values() if not t.done()]
    if running and seconds > 0:
        await asyncio.wait(running, timeout=seconds)
    # once: arq's run_job hands the request back to the queue after the cancel
    await stop_tasks(running, timeout=10, repeat=False)
