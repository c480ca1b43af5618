"""Drives the traffic: schedules requests, caps concurrency, and collects measurements.

Open loop: one scheduler coroutine sleeps until each precomputed due time and
starts the request as a task; it never waits for answers, so a slow server gets
more concurrent requests, as real clients would send them. ``max_concurrency``
makes late requests wait for a slot; that wait is recorded as ``slot_wait_s``
and excluded from the sender lag (it is by design, not the generator's fault).
When a due time has already passed, the scheduler starts the request at once
without yielding, so a backlog drains as fast as the loop allows and shows up
as lag instead of silently lowering the rate.

Closed loop: ``concurrency`` users each send their next request as soon as the
previous one ends (its due time is that moment).

Warmup requests (distinct prompts, same lengths) are sent before the measured run
with the run's concurrency cap and all must end before its clock starts. Then the
target prepares itself (the HTTP client opens a connection, which also warms
the client's code paths: the first request otherwise blocks the loop) and
the objects alive so far are frozen out of the garbage collector's scans. Every
request is bounded by ``timeout`` seconds, counted as a ``timeout`` failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import time
from collections.abc import Iterator, Sequence
from typing import Protocol

import numpy as np

from loadgen.arrivals import arrival_times
from loadgen.config import LoadConfig
from loadgen.measurements import RequestFailed, RequestMeasurement, StreamClock
from loadgen.progress import RunProgress
from loadgen.result import RunResult
from loadgen.workload import RequestSpec, Workload


class Target(Protocol):
    """Where requests go. ``send`` calls ``clock.sent()`` as the request leaves,
    ``clock.content()`` per content chunk, ``clock.usage(n)`` if told the output
    length, and raises :class:`RequestFailed` to classify a failure."""

    name: str

    async def send(self, spec: RequestSpec, clock: StreamClock) -> None: ...

    async def prepare(self) -> None:
        """Get ready before the clock starts (open connections, warm code paths)."""
        ...

    async def aclose(self) -> None: ...


@contextlib.contextmanager
def _quiet_gc() -> Iterator[None]:
    """Freeze the objects that exist before the run out of the garbage collector's scans.

    A full collection walks every live object; with the precomputed traffic in
    memory it stalls the loop for as long as that walk takes, which shows up as
    send lag and latency spikes. Frozen objects are skipped until the run ends.
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def make_target(config: LoadConfig) -> Target:
    """The HTTP client, or the in-process baseline server when ``config.in_process``."""
    if config.in_process:
        from loadgen.baseline import InProcessTarget

        return InProcessTarget(config)
    from loadgen.client import HttpTarget

    return HttpTarget(config)


async def run_load(config: LoadConfig, target: Target | None = None) -> RunResult:
    """Send the configured traffic (warmup first) and return every measurement with the figures.

    ``target`` overrides the one ``config`` selects (the caller then owns it; it is
    not closed here).
    """
    workload = Workload(config)
    owned = target is None
    chosen = make_target(config) if target is None else target
    try:
        warmup: list[RequestMeasurement] = []
        if config.warmup:
            specs = [workload.spec(i, warmup=True) for i in range(config.warmup)]
            warm = _Run(config, chosen, RunProgress(None, enabled=False))
            warmup = await warm.burst(specs, config.slots)
        limit = config.request_limit
        if config.closed_loop:
            total = limit
        else:
            rng = np.random.default_rng([config.seed, 0])
            due = list(
                arrival_times(
                    rng,
                    rate=config.request_rate,
                    burstiness=config.burstiness,
                    ramp=config.ramp_up,
                    num_requests=limit,
                    duration=config.duration,
                )
            )
            total = len(due)
        specs = [] if config.closed_loop else [workload.spec(i) for i in range(len(due))]
        await chosen.prepare()
        with RunProgress(total, enabled=config.progress) as progress, _quiet_gc():
            run = _Run(config, chosen, progress)
            started_at = time.time()
            if config.closed_loop:
                measurements = await run.closed_loop(workload)
            else:
                measurements = await run.open_loop(specs, due)
        return RunResult(
            config=config,
            measurements=measurements,
            duration_s=run.duration_s,
            started_at=started_at,
            target=chosen.name,
            warmup_measurements=warmup,
        )
    finally:
        if owned:
            await chosen.aclose()


class _Run:
    """One batch of requests sharing a start time, a target and a measurement list."""

    def __init__(self, config: LoadConfig, target: Target, progress: RunProgress) -> None:
        self.config = config
        self.target = target
        self.progress = progress
        self.start = time.perf_counter()
        self.duration_s = 0.0
        self.measurements: list[RequestMeasurement] = []

    async def open_loop(
        self, specs: Sequence[RequestSpec], due: Sequence[float]
    ) -> list[RequestMeasurement]:
        cap = self.config.max_concurrency
        slot = asyncio.Semaphore(cap) if cap is not None else None
        self.start = time.perf_counter()
        async with asyncio.TaskGroup() as group:
            for spec, offset in zip(specs, due, strict=True):
                at = self.start + offset
                delay = at - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                group.create_task(self.execute(spec, at, slot))
        return self._measured()

    async def closed_loop(self, workload: Workload) -> list[RequestMeasurement]:
        users = self.config.concurrency or 1
        limit = self.config.request_limit
        counter = itertools.count()
        self.start = time.perf_counter()
        deadline = self.start + self.config.duration if self.config.duration else None

        async def user() -> None:
            while True:
                now = time.perf_counter()
                if deadline is not None and now >= deadline:
                    return
                index = next(counter)
                if limit is not None and index >= limit:
                    return
                await self.execute(workload.spec(index), now, None)

        async with asyncio.TaskGroup() as group:
            for _ in range(users):
                group.create_task(user())
        return self._measured()

    async def burst(
        self, specs: Sequence[RequestSpec], slots: int | None
    ) -> list[RequestMeasurement]:
        """Everything due at once, at most ``slots`` in flight (used for the warmup)."""
        slot = asyncio.Semaphore(slots) if slots is not None else None
        self.start = time.perf_counter()
        async with asyncio.TaskGroup() as group:
            for spec in specs:
                group.create_task(self.execute(spec, self.start, slot))
        return self._measured()

    def _measured(self) -> list[RequestMeasurement]:
        self.duration_s = time.perf_counter() - self.start
        return sorted(self.measurements, key=lambda r: r.index)

    async def execute(
        self, spec: RequestSpec, due: float, slot: asyncio.Semaphore | None
    ) -> RequestMeasurement:
        """Send one request; never raises (failures become the measurement's ``failure``)."""
        measurement = RequestMeasurement(
            index=spec.index,
            priority=spec.priority,
            prompt_tokens=spec.prompt_tokens,
            max_tokens=spec.max_tokens,
            scheduled_s=due - self.start,
        )
        wait = 0.0
        if slot is not None:
            before = time.perf_counter()
            await slot.acquire()
            wait = time.perf_counter() - before
        try:
            clock = StreamClock()
            failure = await self._send(spec, clock)
            ended = time.perf_counter()
        finally:
            if slot is not None:
                slot.release()
        clock.fill(measurement, run_start=self.start, ended_at=ended, failure=failure)
        measurement.slot_wait_s = wait
        measurement.lag_s = measurement.sent_s - measurement.scheduled_s - wait
        self.measurements.append(measurement)
        self.progress.done(measurement)
        return measurement

    async def _send(self, spec: RequestSpec, clock: StreamClock) -> RequestFailed | None:
        timeout = self.config.timeout
        try:
            async with asyncio.timeout(timeout):
                await self.target.send(spec, clock)
        except RequestFailed as exc:
            return exc
        except TimeoutError:
            return RequestFailed("timeout", f"no complete answer within {timeout:g} s")
        except Exception as exc:  # an unexpected bug must not end the whole run
            return RequestFailed("other", f"{type(exc).__name__}: {exc}")
        return None
