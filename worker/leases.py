"""The worker's own view of its request leases: when each would expire by its clock.

A lease is set and judged in Redis's lease time (:mod:`llmq.protocol.queue`), so a
worker learns that it lost one only from a renewal's answer. A worker cut off from
Redis hears nothing: left alone it would generate to the end of the request, on a
GPU, tokens nobody reads while the re-run on another worker pays for them again.

So each held request's lease is also timed here, from the moment its last
successful renewal (or its claim) was *sent*: Redis extended it no earlier than
that, so by ``sent + lease - margin`` of this process's monotonic clock the lease
may be gone, and the run stops then, without waiting for Redis
(:meth:`worker.runner.RequestRunner.expire_leases`). Stopping early is safe: the
run writes nothing more; if Redis still held the lease (Redis was only slow), the
worker no longer renews it and the reaper requeues the request after the lease
runs out, and the re-run resumes from the stream. The margin covers the time from
a claim's script to the run's start here, and a renewal's delay in flight.

Each entry also keeps how many tokens its run had produced when that renewal was
sent: what a fenced run produced beyond it is the work wasted by losing the lease
(``llmq_lease_lost_tokens_total``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Held:
    """One lease as this worker last knew it held."""

    #: Loop time (monotonic) when the renewal that last answered ``ok`` was sent.
    renewed_at: float
    #: Tokens the run had produced (resumed ones included) when it was sent.
    tokens: int


@dataclass
class LeaseClock:
    """Leases timed by this process's clock; ``enabled`` False: never expire. Each
    run keeps its own :class:`Held` (:attr:`worker.run.Run.lease`)."""

    lease_seconds: float
    margin_seconds: float = 0.1
    enabled: bool = True

    def start(self, now: float, tokens: int = 0) -> Held:
        """The lease of a run this worker just claimed (the claim set it)."""
        return Held(now, tokens)

    def renewed(self, lease: Held, sent_at: float, tokens: int) -> None:
        """A renewal sent at ``sent_at`` answered ``ok`` for ``lease``."""
        if sent_at >= lease.renewed_at:
            lease.renewed_at, lease.tokens = sent_at, tokens

    def expires_at(self, lease: Held) -> float:
        return lease.renewed_at + self.lease_seconds - self.margin_seconds

    def due(self, lease: Held, now: float) -> bool:
        """Whether ``lease`` would have expired by ``now``."""
        return self.enabled and now - lease.renewed_at >= self.lease_seconds - self.margin_seconds
