"""When each request of an open loop is due, as offsets in seconds from the run's start.

Inter-arrival gaps follow vLLM's convention: ``Gamma(shape=burstiness,
scale=1 / (rate * burstiness))``, so the mean gap is ``1 / rate`` whatever the
burstiness, and the coefficient of variation is ``1 / sqrt(burstiness)``:
``burstiness = 1`` is a Poisson process, lower values cluster arrivals into bursts,
higher values approach a metronome. The first request is due at 0, as in vLLM.

A linear ramp (``rate(t) = start + (end - start) * t / horizon``) is produced by
time rescaling: gaps are drawn with mean 1 in *operational time* ``u`` and mapped
to wall time through the inverse of the cumulative rate ``Λ(t) = ∫ rate``. For a
constant rate this is exactly ``t = u / rate``; for a ramp it keeps the gamma
dispersion while the rate changes smoothly, and it accepts a ramp from 0. The
horizon is the run's duration or, when only a request count bounds the run, the
expected time to send that many (``2 N / (start + end)``); past it the rate
stays at ``end``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

_BLOCK = 1024  # gaps drawn per numpy call; per-draw calls would dominate at high rates


class RampClock:
    """Maps operational time (mean one arrival per unit) to seconds for a linear ramp."""

    def __init__(self, start: float, end: float, horizon: float) -> None:
        if start < 0 or end <= 0 or horizon <= 0:
            raise ValueError("a ramp needs start >= 0, end > 0 and a positive horizon")
        self.start, self.end, self.horizon = start, end, horizon
        self._a = (end - start) / (2.0 * horizon)  # Λ(t) = start*t + a*t² for t <= horizon
        self._total = horizon * (start + end) / 2.0  # Λ(horizon)

    def seconds(self, u: float) -> float:
        """Λ⁻¹(u): the wall time at which ``u`` expected arrivals have happened."""
        if u <= 0.0:
            return 0.0
        if u > self._total:
            return self.horizon + (u - self._total) / self.end
        # The stable root of a*t² + start*t - u = 0 (valid for a ramp up or down).
        disc = max(self.start * self.start + 4.0 * self._a * u, 0.0)
        return 2.0 * u / (self.start + math.sqrt(disc))


def ramp_horizon(
    ramp: tuple[float, float], duration: float | None, num_requests: int | None
) -> float:
    """The ramp's length: the run's expected length (see the module docstring)."""
    start, end = ramp
    candidates = []
    if duration is not None:
        candidates.append(duration)
    if num_requests is not None:
        candidates.append(2.0 * num_requests / (start + end))
    if not candidates:
        raise ValueError("a ramp needs a duration or a number of requests")
    return min(candidates)


def arrival_times(
    rng: np.random.Generator,
    *,
    rate: float,
    burstiness: float = 1.0,
    ramp: tuple[float, float] | None = None,
    num_requests: int | None = None,
    duration: float | None = None,
) -> Iterator[float]:
    """Yield the due offsets (seconds, non-decreasing) until either bound is reached.

    ``rate = inf`` without a ramp yields 0 for every request (all at once) and so
    needs ``num_requests``. At least one bound must be given.
    """
    if num_requests is None and duration is None:
        raise ValueError("arrival_times needs num_requests or duration")
    if ramp is None and math.isinf(rate):
        if num_requests is None:
            raise ValueError("an infinite rate needs num_requests")
        yield from (0.0 for _ in range(num_requests))
        return
    clock = RampClock(*ramp, ramp_horizon(ramp, duration, num_requests)) if ramp else None
    u = 0.0
    count = 0
    while True:
        for gap in rng.gamma(shape=burstiness, scale=1.0 / burstiness, size=_BLOCK):
            t = clock.seconds(u) if clock is not None else u / rate
            if (num_requests is not None and count >= num_requests) or (
                duration is not None and t >= duration
            ):
                return
            yield t
            count += 1
            u += float(gap)


def schedule(
    rng: np.random.Generator,
    *,
    rate: float,
    burstiness: float = 1.0,
    ramp: tuple[float, float] | None = None,
    num_requests: int | None = None,
    duration: float | None = None,
) -> npt.NDArray[np.float64]:
    """All due offsets at once, as an array (for tests and plots)."""
    return np.fromiter(
        arrival_times(
            rng,
            rate=rate,
            burstiness=burstiness,
            ramp=ramp,
            num_requests=num_requests,
            duration=duration,
        ),
        dtype=float,
    )
