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

from dataclasses import dataclass, field


@dataclass(slots=True)
class Held:
    """One lease as this worker last knew it held."""

    #: Loop time (monotonic) when the renewal that last answered ``ok`` was sent.
    renewed_at: float
    #: Tokens the run had produced (resumed ones included) when it was sent.
    tokens: int


@dataclass
class LeaseClock:
    """Held leases timed by this process's clock; ``enabled`` False: never expire."""

    lease_seconds: float
    margin_seconds: float = 0.1
    enabled: bool = True
    held: dict[str, Held] = field(default_factory=dict)

    def start(self, request_id: str, now: float, tokens: int = 0) -> None:
        """A run of a request this worker just claimed (the claim set its lease)."""
        self.held[request_id] = Held(now, tokens)

    def renewed(self, request_id: str, sent_at: float, tokens: int) -> None:
        """A renewal sent at ``sent_at`` answered ``ok`` for ``request_id``."""
        lease = self.held.get(request_id)
        if lease is not None and sent_at >= lease.renewed_at:
            lease.renewed_at, lease.tokens = sent_at, tokens

    def forget(self, request_id: str) -> Held | None:
        return self.held.pop(request_id, None)

    def tokens_at_renewal(self, request_id: str) -> int | None:
        lease = self.held.get(request_id)
        return None if lease is None else lease.tokens

    def expires_at(self, request_id: str) -> float | None:
        lease = self.held.get(request_id)
        if lease is None:
            return None
        return lease.renewed_at + self.lease_seconds - self.margin_seconds

    def due(self, now: float) -> list[str]:
        """Requests whose lease would have expired by ``now``."""
        if not self.enabled:
            return []
        limit = self.lease_seconds - self.margin_seconds
        return [rid for rid, lease in self.held.items() if now - lease.renewed_at >= limit]
