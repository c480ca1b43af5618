"""The controller loop: every period, hold the lease, read the cluster, decide, act, show it.

Every decision is visible three ways: the published state per model
(``llmq:autoscaler:state``: desired, actual, starting, its maximum; ``/metrics`` shows
it as ``llmq_autoscaler_desired_workers``, ``llmq_autoscaler_actual_workers`` and
``llmq_autoscaler_max_workers``), a
counter of actions by direction and reason (``llmq_autoscaler_actions_total``), and
a ``scaled`` entry on the lifecycle stream for each action.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import replace

from redis.asyncio import Redis

from llmq import metrics
from llmq.autoscale.drivers import Driver, PublishDriver
from llmq.autoscale.law import ControlLaw, Decision, LawSettings, Policy, Signals
from llmq.autoscale.lease import LeaderLease
from llmq.autoscale.signals import ClusterProbe
from llmq.autoscale.state import publish
from llmq.connection import connect
from llmq.policy import store as policy_store
from llmq.protocol.streams import add_lifecycle
from llmq.schema import Lifecycle, ScaleState
from llmq.settings import AutoscaleSettings, ControllerSettings
from llmq.tasks import stop_tasks

log = logging.getLogger(__name__)


def law_settings(settings: ControllerSettings, bounds: tuple[int, int]) -> LawSettings:
    return LawSettings(
        min_workers=bounds[0],
        max_workers=bounds[1],
        slo_ttft_seconds=settings.slo_ttft_ms / 1000,
        slo_tpot_seconds=settings.slo_tpot_ms / 1000,
        headroom=settings.scale_headroom,
        dead_band=settings.scale_dead_band,
        down_window_seconds=settings.scale_down_window_seconds,
        idle_to_zero_seconds=settings.scale_to_zero_seconds,
        startup_seconds=settings.worker_startup_seconds,
    )


class Controller:
    def __init__(
        self,
        redis: Redis,
        settings: ControllerSettings,
        models: list[str],
        driver: Driver,
        *,
        bounds: tuple[int, int],
        concurrency: int,
        lease: LeaderLease | None = None,
        make_policy: Callable[[LawSettings], Policy] = ControlLaw,
    ) -> None:
        """``make_policy``: the decision rule (llmq's law; benchmarks pass baselines)."""
        self.redis = redis
        self.settings = settings
        self.models = models
        self.driver = driver
        self.concurrency = concurrency
        self.lease = lease or LeaderLease(redis, settings.autoscaler_lease_seconds)
        self.tally = metrics.Tally()
        self.laws = {m: make_policy(law_settings(settings, bounds)) for m in models}
        self.probes = {
            m: ClusterProbe(redis, m, worker_ttl=settings.worker_ttl_seconds) for m in models
        }
        self.leading = False
        self._complained = False

    async def run(self, stop: asyncio.Event) -> None:
        """Control until ``stop`` is set; then release the lease for a standby to take."""
        flusher = asyncio.create_task(metrics.flush_forever(self.tally, self.redis))
        try:
            while not stop.is_set():
                try:
                    await self.tick()
                    self._complained = False
                except Exception as exc:
                    if not self._complained:
                        log.warning("autoscaler period failed (retrying every period): %s", exc)
                        self._complained = True
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.settings.scale_interval_seconds):
                        await stop.wait()
        finally:
            await stop_tasks([flusher], timeout=2)
            await metrics.final_flush(self.tally, self.redis)
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):
                    await self.lease.release()

    async def tick(self) -> list[Decision]:
        held = await self.lease.hold()
        if held != self.leading:
            log.info(
                "autoscaler %s %s the lease",
                self.lease.owner,
                "holds" if held else "lost (or waits for)",
            )
            self.leading = held
        if not held:
            return []
        return [await self._control(model) for model in self.models]

    async def _control(self, model: str) -> Decision:
        probe, law = self.probes[model], self.laws[model]
        snap = await probe.snapshot()
        live = snap.workers
        starting = self.driver.starting(model, live)
        measured = self.driver.startup_seconds()
        if measured is not None:
            law.settings = law_settings_with_startup(law.settings, measured)
        signals = Signals(
            queued=snap.queued,
            running=snap.running,
            arrival_rate=probe.arrival_rate(),
            service_seconds=probe.service_seconds(),
            concurrency=max((w.concurrency for w in live), default=self.concurrency),
            ready=len(live),
            starting=starting,
            ttft_p90_seconds=probe.p90("ttft"),
            tpot_p90_seconds=probe.p90("tpot"),
            arrival_rate_recent=probe.arrival_rate(probe.recent_window),
            arrivals_counted=probe.counted(law.settings.cut_window_seconds),
        )
        decision = law.decide(signals, time.monotonic())
        if decision.direction != "none":
            if not self.lease.valid():  # stalled past the lease: another may lead now
                log.warning("autoscaler lease expired before acting; skipping this period")
                return Decision(signals.ready + starting, decision.desired, "none", "lease")
            await self.driver.scale(model, decision.target, live)
            await self._note_action(model, decision, signals)
        expires = time.time() + max(3 * self.settings.scale_interval_seconds, 3.0)
        await publish(
            self.redis,
            model,
            ScaleState(
                desired=decision.target,
                actual=signals.ready,
                starting=starting
                if decision.direction == "none"
                else max(decision.target - signals.ready, 0),
                target=decision.target,
                max_workers=law.settings.max_workers,
                owner=self.lease.owner,
                expires_at=expires,
            ),
        )
        return decision

    async def _note_action(self, model: str, decision: Decision, s: Signals) -> None:
        """Log a scaling action, count it, and write its ``scaled`` lifecycle note."""
        ordered = s.ready + s.starting
        log.info(
            "scale %s %s: %d -> %d workers (%s; queued %d, running %d, arrivals %.2f/s "
            "(recent %.2f/s), service %s, ready %d, starting %d)",
            model,
            decision.direction,
            ordered,
            decision.target,
            decision.reason,
            s.queued,
            s.running,
            s.arrival_rate,
            s.arrival_rate if s.arrival_rate_recent is None else s.arrival_rate_recent,
            "unmeasured" if s.service_seconds is None else f"{s.service_seconds:.2f}s",
            s.ready,
            s.starting,
        )
        self.tally.inc(metrics.AUTOSCALER_ACTIONS, model, decision.direction, decision.reason)
        note = Lifecycle(
            event="scaled",
            request_id="",
            model=model,
            ts=time.time(),
            direction="up" if decision.direction == "up" else "down",
            reason=decision.reason,
            desired=decision.desired,
            actual=ordered,
            target=decision.target,
        )
        # The autoscaler follows no policy: it reads the pool's cap when it writes
        # (once per action, a rare write).
        pool = await policy_store.show(self.redis)
        pipe = self.redis.pipeline(transaction=False)
        add_lifecycle(pipe, note, maxlen=pool.policy.lifecycle_maxlen)
        await pipe.execute()


def law_settings_with_startup(settings: LawSettings, startup: float) -> LawSettings:
    return replace(settings, startup_seconds=startup)


async def serve(settings: AutoscaleSettings) -> int:
    """``llmq autoscale``: control and publish until SIGTERM/SIGINT (no local driver)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    bounds = settings.bounds or (1, 8)
    models = [m.strip() for m in settings.models.split(",") if m.strip()]
    redis = connect(settings, max_connections=4)
    log.info("autoscaler for %s, %d:%d workers, publishing the desired count", models, *bounds)
    try:
        controller = Controller(
            redis,
            settings,
            models,
            PublishDriver(),
            bounds=bounds,
            concurrency=settings.concurrency,
        )
        await controller.run(stop)
    finally:
        await redis.aclose(close_connection_pool=True)
    return 0
