"""The chaos checker on hand-made histories: a correct one passes, and each rule
flags a history that breaks it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from bench.chaos.checker import check, delivered
from bench.chaos.history import (
    BatchRun,
    Fault,
    History,
    Process,
    Request,
    Spec,
    from_json,
    to_json,
)

pytestmark = pytest.mark.timeout(10)

REF = ["a", " b", " c", " d"]
START = 1000.0


def reference(spec: Spec) -> list[str]:
    return REF[: spec.max_tokens]


def native(n: int = 0, **changes: object) -> Request:
    r = Request(
        Spec(n, "native", seed=1, prompt="p", max_tokens=4),
        submitted_at=1.0,
        request_id=f"r{n}",
        outcome="done",
        ended_at=3.0,
        events=[(0, ["a", " b"]), (2, [" c", " d"])],
        finish_reason="length",
        usage_tokens=4,
        record=_record("done", "length", 4, at=3.0),
        settled_after=0.0,
    )
    return dataclasses.replace(r, **changes)  # type: ignore[arg-type]


def openai(n: int = 1, **changes: object) -> Request:
    r = Request(
        Spec(n, "openai", seed=1, prompt="p", max_tokens=4),
        submitted_at=1.0,
        request_id=f"r{n}",
        outcome="done",
        ended_at=3.0,
        text="a b c d",
        finish_reason="length",
        usage_tokens=4,
        record=_record("done", "length", 4, at=3.0),
        settled_after=0.0,
    )
    return dataclasses.replace(r, **changes)  # type: ignore[arg-type]


def _record(status: str, reason: str, tokens: int, at: float) -> dict[str, str]:
    return {
        "status": status,
        "finish_reason": reason,
        "completion_tokens": str(tokens),
        "finished_at": str(START + at),
    }


def history(*requests: Request, **changes: object) -> History:
    h = History(
        seed=1,
        duration=10,
        started_unix=START,
        requests=list(requests),
        quiet_at=10.0,
        counters={
            "length": float(sum(r.record.get("finish_reason") == "length" for r in requests))
        },
    )
    return dataclasses.replace(h, **changes)  # type: ignore[arg-type]


def batch(**changes: object) -> BatchRun:
    """Two lines, each in the output once with the undisturbed text."""
    run = BatchRun(
        specs=[Spec(100, "openai", seed=1, prompt="p", max_tokens=n) for n in (4, 2)],
        batch_id="batch_1",
        status="completed",
    )
    run.specs[1] = dataclasses.replace(run.specs[1], n=101)
    run.output = [("line-100", "a b c d"), ("line-101", "a b")]
    return dataclasses.replace(run, **changes)  # type: ignore[arg-type]


def rules(h: History) -> list[str]:
    return [v.rule for v in check(h, reference)]


def test_a_correct_history_passes_and_survives_json() -> None:
    h = history(native(0), openai(1), batch=batch(), counters={"length": 4.0})
    assert check(h, reference) == []
    assert check(from_json(to_json(h)), reference) == []


def test_delivered_counts_tokens_of_a_prefix_and_rejects_anything_else() -> None:
    assert delivered("", REF) == 0
    assert delivered("a b", REF) == 2
    assert delivered("a b c d", REF) == 4
    assert delivered("a b c d e", REF) is None
    assert delivered("a  b", REF) is None
    assert delivered("a b ", REF) is None  # cut inside a token


CASES: dict[str, tuple[str, Callable[[], History]]] = {
    "never ended": ("ends", lambda: history(native(record={"status": "running"}))),
    "ended late": ("ends", lambda: history(native(settled_after=61.0))),
    "client hung": ("ends", lambda: history(native(outcome="hung"))),
    "an index twice": (
        "indices",
        lambda: history(native(events=[(0, ["a", " b"]), (1, [" b", " c"]), (3, [" d"])])),
    ),
    "an index missing": ("indices", lambda: history(native(events=[(0, ["a"]), (2, [" c"])]))),
    "other text": ("text", lambda: history(native(events=[(0, ["a", " x", " c", " d"])]))),
    "done short": (
        "text",
        lambda: history(native(events=[(0, ["a", " b"])], usage_tokens=2)),
    ),
    "cancelled by nobody": (
        "text",
        lambda: history(
            native(
                events=[(0, ["a"])],
                finish_reason="cancelled",
                usage_tokens=1,
                record=_record("cancelled", "cancelled", 1, at=3.0),
            ),
            counters={"cancelled": 1.0},
        ),
    ),
    "native usage": ("usage", lambda: history(native(usage_tokens=0))),
    "openai usage": ("usage", lambda: history(openai(usage_tokens=3))),
    "openai not a prefix": ("text", lambda: history(openai(text="a b b c d"))),
    "cut but looks complete": (
        "complete",
        lambda: history(openai(text="a b", usage_tokens=2, outcome="cut")),
    ),
    "left queued": ("settled", lambda: history(native(), queued=1)),
    "left running": ("settled", lambda: history(native(), running=2)),
    "counted twice": ("metrics", lambda: history(native(), counters={"length": 2.0})),
    "not counted": ("metrics", lambda: history(native(), counters={})),
    "a fault never healed": (
        "nemesis",
        lambda: history(native(), nemesis_error="TimeoutError: no replica promoted"),
    ),
    "a batch line twice": (
        "batch",
        lambda: history(batch=batch(output=[*batch().output, ("line-100", "a b c d")])),
    ),
    "a batch line missing": ("batch", lambda: history(batch=batch(output=batch().output[:1]))),
    "a batch line failed": (
        "batch",
        lambda: history(
            batch=batch(output=batch().output[:1], errors=[("line-101", "status 500")])
        ),
    ),
    "a batch line's text differs": (
        "batch",
        lambda: history(batch=batch(output=[("line-100", "a b c"), ("line-101", "a b")])),
    ),
    "a batch not completed": ("batch", lambda: history(batch=batch(status="expired"))),
    "crashed": (
        "crashes",
        lambda: history(native(), processes=[Process("worker1", 7, 1, by_nemesis=False)]),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_rule_flags_a_history_that_breaks_it(case: str) -> None:
    rule, build = CASES[case]
    assert rule in rules(build()), case


def test_a_cancelled_prefix_and_a_cut_prefix_are_correct() -> None:
    cancelled = native(
        events=[(0, ["a"])],
        finish_reason="cancelled",
        usage_tokens=1,
        cancelled=True,
        record=_record("cancelled", "cancelled", 1, at=3.0),
    )
    cut = openai(text="a b", usage_tokens=None, outcome="cut", finish_reason=None)
    h = history(cancelled, cut, counters={"cancelled": 1.0, "length": 1.0})
    assert check(h, reference) == []


def test_a_count_lost_with_a_killed_process_is_allowed_but_never_an_extra_one() -> None:
    kill = Fault("worker-kill", ["worker1"], started_at=3.5, ended_at=5.0)
    lost = history(native(), counters={}, faults=[kill])
    assert check(lost, reference) == []
    extra = history(native(), counters={"length": 2.0}, faults=[kill])
    assert rules(extra) == ["metrics"]


def test_a_process_the_nemesis_killed_is_no_crash() -> None:
    h = history(native(), processes=[Process("worker1", 7, -9, by_nemesis=True)])
    assert check(h, reference) == []
