"""How fast this worker's engine serves, measured from its own runs.

The adaptive routing guard (``llmq/protocol/lua/affinity.lua``, ``too_busy``) weighs a
busy worker's wait for a slot against recomputing the prefix it holds elsewhere, so
it needs two figures that depend on the engine, the model and the hardware, which no
operator should have to guess: how long a run holds a slot, and how long the engine
takes to compute an uncached KV block of a prompt. Both come from the runs this
worker finished (:meth:`PaceMeter.ran`) and travel with its load
(:class:`llmq.protocol.routing.Pace`).

The prefill cost is the slope of the time to the first token over the uncached
prompt tokens (least squares over the last :data:`SAMPLES` runs): the intercept
takes what every first token costs whatever its prompt (a step, the wait for the
step under way), so short and cached prompts do not inflate it. Until the runs'
uncached lengths spread over :data:`MIN_SPREAD_TOKENS` there is no slope to read, and
the figure stays 0 (not measured): the guard then waits for the holder, as affinity
alone would, within the wait and overtaking guards.
"""

from __future__ import annotations

from collections import deque

from llmq.model.blocks import BLOCK_SIZE
from llmq.protocol.routing import Pace

#: Runs the prefill slope is fitted over (bounded memory, follows a changing load).
SAMPLES = 64
#: Least spread of uncached prompt lengths the slope is read from.
MIN_SPREAD_TOKENS = 64
#: Weight of each finished run in the mean time a run holds a slot.
SERVICE_WEIGHT = 0.1


class PaceMeter:
    """The figures of :class:`llmq.protocol.routing.Pace`, from this worker's finished runs."""

    def __init__(self) -> None:
        self._prefills: deque[tuple[int, float]] = deque(maxlen=SAMPLES)
        self._service_s: float | None = None
        self._pace: Pace | None = None  # what now() read since the last run

    def ran(self, uncached_tokens: int, first_token_s: float, held_s: float) -> None:
        """A run ended: its uncached prompt tokens, its time from start to first token,
        and how long it held its slot."""
        self._prefills.append((max(uncached_tokens, 0), max(first_token_s, 0.0)))
        held_s = max(held_s, 0.0)
        if self._service_s is None:
            self._service_s = held_s
        else:
            self._service_s += SERVICE_WEIGHT * (held_s - self._service_s)
        self._pace = None

    def block_s(self) -> float | None:
        """Seconds to compute one uncached block of a prompt; None: not measured yet."""
        n = len(self._prefills)
        if n < 2:
            return None
        xs = [x for x, _ in self._prefills]
        if max(xs) - min(xs) < MIN_SPREAD_TOKENS:
            return None
        mean_x = sum(xs) / n
        mean_y = sum(y for _, y in self._prefills) / n
        cov = sum((x - mean_x) * (y - mean_y) for x, y in self._prefills)
        var = sum((x - mean_x) ** 2 for x in xs)
        return max(cov / var, 0.0) * BLOCK_SIZE

    def now(self) -> Pace:
        """The figures as they stand (0: not measured); read again after a run only."""
        if self._pace is None:
            block = self.block_s()
            self._pace = Pace(
                service_ms=round((self._service_s or 0.0) * 1000),
                block_us=0 if block is None else max(round(block * 1e6), 1),
            )
        return self._pace
