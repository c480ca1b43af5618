"""The worker's own lease clock: a lease is due a lease (less the margin) after the
last renewal that answered, counted from when that renewal was sent."""

from __future__ import annotations

from worker.leases import LeaseClock


def test_a_lease_is_due_a_lease_after_its_last_answered_renewal_was_sent() -> None:
    clock = LeaseClock(lease_seconds=2.0, margin_seconds=0.5)
    clock.start("a", now=10.0)
    assert clock.due(11.4) == []
    assert clock.due(11.5) == ["a"]
    clock.renewed("a", sent_at=11.0, tokens=40)
    assert clock.due(12.4) == [] and clock.due(12.5) == ["a"]
    assert clock.tokens_at_renewal("a") == 40


def test_an_older_renewal_answering_late_does_not_move_the_lease_back() -> None:
    clock = LeaseClock(lease_seconds=2.0, margin_seconds=0.0)
    clock.start("a", now=10.0)
    clock.renewed("a", sent_at=12.0, tokens=5)
    clock.renewed("a", sent_at=11.0, tokens=3)
    assert clock.expires_at("a") == 14.0 and clock.tokens_at_renewal("a") == 5


def test_switched_off_nothing_is_ever_due() -> None:
    clock = LeaseClock(lease_seconds=1.0, enabled=False)
    clock.start("a", now=0.0)
    assert clock.due(100.0) == []


def test_a_forgotten_or_unknown_request_is_never_due() -> None:
    clock = LeaseClock(lease_seconds=1.0)
    clock.renewed("ghost", sent_at=0.0, tokens=1)
    clock.start("a", now=0.0)
    assert clock.forget("a") is not None
    assert clock.due(100.0) == [] and clock.expires_at("a") is None
