"""The control law on synthetic signals: a fluid queue served by workers that take time to start."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from llmq.autoscale.law import ControlLaw, Decision, LawSettings, Signals, wanted

SERVICE = 1.0  # seconds a request holds a slot
SLOTS = 4  # per worker


def settings(**overrides: float) -> LawSettings:
    chosen: dict[str, float] = {
        "min_workers": 1,
        "max_workers": 20,
        "slo_ttft_seconds": 2.0,
        "slo_tpot_seconds": 0.1,
        "headroom": 0.2,
        "down_window_seconds": 30.0,
        "idle_to_zero_seconds": 60.0,
        "startup_seconds": 2.0,
        **overrides,
    }
    return LawSettings(**chosen)  # type: ignore[arg-type]


@dataclass
class Cluster:
    """Requests in the system as a fluid: running = min(in system, slots)."""

    startup: float
    ready: int = 1
    starting: list[float] = field(default_factory=list)
    in_system: float = 0.0
    decisions: list[tuple[float, Decision]] = field(default_factory=list)

    def step(self, now: float, rate: float, law: ControlLaw, measured_rate: float) -> Decision:
        self.ready += sum(1 for t in self.starting if t <= now)
        self.starting = [t for t in self.starting if t > now]
        slots = self.ready * SLOTS
        running = min(self.in_system, slots)
        self.in_system += rate - running / SERVICE  # one-second tick
        self.in_system = max(self.in_system, 0.0)
        running = min(self.in_system, slots)
        signals = Signals(
            queued=math.ceil(self.in_system - running - 1e-9),
            running=math.ceil(running - 1e-9),
            arrival_rate=measured_rate,
            service_seconds=SERVICE,
            concurrency=SLOTS,
            ready=self.ready,
            starting=len(self.starting),
        )
        decision = law.decide(signals, now)
        ordered = self.ready + len(self.starting)
        if decision.target > ordered:
            self.starting += [now + self.startup] * (decision.target - ordered)
        elif decision.target < ordered:
            self.ready -= ordered - decision.target
        if decision.direction != "none":
            self.decisions.append((now, decision))
        return decision

    def run(
        self, law: ControlLaw, rate: Callable[[float], float], seconds: int, noise: float = 0.0
    ) -> None:
        rng = random.Random(7)
        for t in range(seconds):
            r = rate(float(t))
            measured = max(r * (1 + rng.uniform(-noise, noise)), 0.0)
            self.step(float(t), r, law, measured)

    def ups(self) -> list[tuple[float, Decision]]:
        return [(t, d) for t, d in self.decisions if d.direction == "up"]

    def downs(self) -> list[tuple[float, Decision]]:
        return [(t, d) for t, d in self.decisions if d.direction == "down"]


def needed(rate: float, headroom: float = 0.2) -> int:
    return math.ceil(rate * SERVICE * (1 + headroom) / SLOTS - 1e-9)


def reversals(decisions: list[tuple[float, Decision]]) -> int:
    directions = [d.direction for _, d in decisions]
    return sum(1 for a, b in itertools.pairwise(directions) if a != b)


def test_a_step_is_answered_in_the_same_period_and_not_over_ordered() -> None:
    law = ControlLaw(settings())
    cluster = Cluster(startup=2.0)
    cluster.run(law, lambda t: 2.0 if t < 20 else 20.0, 60)
    first_up = cluster.ups()[0]
    assert first_up[0] == 20.0, "first action in the period the step is seen"
    # capacity for the new rate ordered at once, plus some to drain the backlog
    assert cluster.ups()[0][1].target >= needed(20.0)
    assert max(d.target for _, d in cluster.decisions) <= 2 * needed(20.0)
    assert cluster.downs() == [] or cluster.downs()[0][0] >= 20.0 + 30.0


def test_starting_workers_count_as_capacity() -> None:
    """While an ordered worker boots, a TTFT still over its objective (it lags: it is
    measured on requests that already waited) does not order one more each period."""
    law = ControlLaw(settings())

    def late(ready: int, starting: int) -> Signals:
        return Signals(2, 4, 0.5, SERVICE, SLOTS, ready, starting, ttft_p90_seconds=5.0)

    first = law.decide(late(2, 0), 0.0)
    assert (first.direction, first.target, first.reason) == ("up", 3, "slo_ttft")
    for t in range(1, 5):  # booting: the same measurements, no new order
        assert law.decide(late(2, 1), float(t)).direction == "none"
    # up, but the TTFT window still holds requests that waited for it: no new order
    for t in range(5, 10):
        assert law.decide(late(3, 0), float(t)).direction == "none"
    assert law.decide(late(3, 0), 10.0).target == 4  # a window later, still late: one more


def test_a_ramp_is_followed_without_scaling_down() -> None:
    law = ControlLaw(settings())
    cluster = Cluster(startup=2.0)
    cluster.run(law, lambda t: 1.0 + t * 0.2, 120)  # 1 -> 25 req/s
    assert cluster.downs() == []
    targets = [d.target for _, d in cluster.ups()]
    assert targets == sorted(targets) and targets[-1] >= needed(24.0)
    assert cluster.ready >= needed(24.0, headroom=0.0)


def test_noise_at_steady_load_does_not_flap() -> None:
    law = ControlLaw(settings())
    cluster = Cluster(startup=2.0, ready=needed(10.0))
    # +-25% uniform: the spread of a 5 s window's count at 10 req/s (Poisson)
    cluster.run(law, lambda t: 10.0, 600, noise=0.25)
    assert reversals(cluster.decisions) <= 1
    assert len(cluster.decisions) <= 3


def test_scale_down_waits_for_the_window_and_goes_one_step_at_a_time() -> None:
    law = ControlLaw(settings(down_window_seconds=20.0))
    cluster = Cluster(startup=2.0)
    cluster.run(law, lambda t: 20.0 if t < 40 else 2.0, 120)
    downs = cluster.downs()
    below_peak = [t for t, d in downs if d.target < needed(20.0)]
    assert below_peak and below_peak[0] >= 40.0 + 20.0
    steps = [(t, d.target) for t, d in downs]
    assert all(b[1] == a[1] - 1 for a, b in itertools.pairwise(steps))
    assert cluster.ready == needed(2.0)


def test_scale_to_zero_after_idle_and_activation_by_a_queued_request() -> None:
    cfg = settings(min_workers=0, down_window_seconds=5.0, idle_to_zero_seconds=10.0)
    law = ControlLaw(cfg)
    cluster = Cluster(startup=2.0)
    cluster.run(law, lambda t: 1.0 if t < 5 else 0.0, 40)
    assert cluster.ready == 0 and cluster.downs()[-1][1].reason == "idle"
    gone = cluster.downs()[-1][0]
    assert gone >= 5 + cfg.idle_to_zero_seconds
    # one request arrives at a model with no worker: one is ordered at once
    idle = Signals(0, 0, 0.0, SERVICE, SLOTS, ready=0)
    assert law.decide(idle, 41.0).direction == "none"
    queued = Signals(1, 0, 0.0, SERVICE, SLOTS, ready=0)
    decision = law.decide(queued, 42.0)
    assert (decision.direction, decision.target, decision.reason) == ("up", 1, "activation")


def test_bounds() -> None:
    law = ControlLaw(settings(min_workers=2, max_workers=5))
    assert law.decide(Signals(0, 0, 0.0, SERVICE, SLOTS, ready=0), 0.0).target == 2
    flood = Signals(500, 20, 100.0, SERVICE, SLOTS, ready=5)
    decision = law.decide(flood, 1.0)
    assert (decision.target, decision.direction) == (5, "none")


def test_cold_start_gives_every_request_a_slot() -> None:
    """No service time measured yet: running + queued slots."""
    assert wanted(settings(), Signals(9, 3, 0.0, None, SLOTS, ready=1)) == (3, "backlog")


@pytest.mark.parametrize(
    ("ttft", "starting", "expected"),
    [(3.0, 0, (3, "slo_ttft")), (1.0, 0, (1, "load")), (3.0, 1, (1, "load"))],
)
def test_ttft_above_its_objective_orders_one_more(
    ttft: float, starting: int, expected: tuple[int, str]
) -> None:
    """The measurement beats the model: queued requests with TTFT over the objective
    order one more worker, unless capacity is already on its way."""
    s = Signals(1, 4, 0.5, SERVICE, SLOTS, ready=2, starting=starting, ttft_p90_seconds=ttft)
    assert wanted(settings(), s) == expected
