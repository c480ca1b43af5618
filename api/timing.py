"""TTFT and end-to-end latency as the API relays them, for every route that relays.

Measured from the request's arrival at the API to the first token (and to the
end) leaving it: what a client sees, queueing included. The OpenAI routes time
from their handler's start; the native event stream from the request's
acceptance (its record's ``created_at``), when a client reads it from the start.
"""

from __future__ import annotations

import time

from api.state import AppState
from llmq import metrics


class RelayTimer:
    def __init__(self, state: AppState, model: str, arrived: float) -> None:
        """``arrived``: ``time.monotonic()`` when the request arrived."""
        self.metrics, self.model, self.arrived = state.metrics, model, arrived
        self.first = False

    @classmethod
    def since(cls, state: AppState, model: str, accepted_at: float) -> RelayTimer:
        """A timer for a request accepted at Unix time ``accepted_at``."""
        return cls(state, model, time.monotonic() - max(0.0, time.time() - accepted_at))

    def tokens(self) -> None:
        if not self.first:
            self.first = True
            self.metrics.observe(metrics.TTFT, time.monotonic() - self.arrived, self.model)

    def end(self) -> None:
        self.metrics.observe(metrics.E2E, time.monotonic() - self.arrived, self.model)
