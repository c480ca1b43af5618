"""The worker's own lease clock: a lease is due a lease (less the margin) after the
last renewal that answered, counted from when that renewal was sent."""

from __future__ import annotations

from worker.leases import LeaseClock


def test_a_lease_is_due_a_lease_after_its_last_answered_renewal_was_sent() -> None:
    clock = LeaseClock(lease_seconds=2.0, margin_seconds=0.5)
    lease = clock.start(now=10.0)
    assert not clock.due(lease, 11.4)
    assert clock.due(lease, 11.5)
    clock.renewed(lease, sent_at=11.0, tokens=40)
    assert not clock.due(lease, 12.4) and clock.due(lease, 12.5)
    assert lease.tokens == 40


def test_an_older_renewal_answering_late_does_not_move_the_lease_back() -> None:
    clock = LeaseClock(lease_seconds=2.0, margin_seconds=0.0)
    lease = clock.start(now=10.0)
    clock.renewed(lease, sent_at=12.0, tokens=5)
    clock.renewed(lease, sent_at=11.0, tokens=3)
    assert clock.expires_at(lease) == 14.0 and lease.tokens == 5


def test_switched_off_nothing_is_ever_due() -> None:
    clock = LeaseClock(lease_seconds=1.0, enabled=False)
    lease = clock.start(now=0.0)
    assert not clock.due(lease, 100.0)
