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
        Spec(n, "native", seed=1, prompt="p", max_tokens=4, tenant="steady"),
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
        Spec(n, "openai", seed=1, prompt="p", max_tokens=4, tenant="steady"),
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
    h = history(native(0), openai(1), batches=[batch()], counters={"length": 4.0})
    assert check(h, reference) == []
    assert check(from_json(to_json(h)), reference) == []


def test_delivered_counts_tokens_of_a_prefix_and_rejects_anything_else() -> None:
    assert delivered("", REF) == 0
    assert delivered("a b", REF) == 2
    assert delivered("a b c d", REF) == 4
    assert delivered("a b c d e", REF) is None
    assert delivered("a  b", REF) is None
    assert delivered("a b ", REF) is None  # cut inside a token


#: Prompt + completion tokens of ``native()``'s record.
TOKENS = 4.0
API1 = "http://api1:8000"
#: Graceful stops overlapping ``native()`` and ``openai()`` (submitted at 1 s, ended at 3 s).
TERM = Fault("worker-term", ["worker1"], 1.5, 2.5)
API_TERM = Fault("api-term", ["api1"], 1.5, 2.5, detail={"apis": [API1]})
#: An OpenAI stream its stopping API ended with the documented error chunk.
SHUT: dict[str, object] = {
    "outcome": "error",
    "finish_reason": None,
    "text": "a b",
    "usage_tokens": None,
    "error_code": "shutting_down",
}

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
        lambda: history(batches=[batch(output=[*batch().output, ("line-100", "a b c d")])]),
    ),
    "a batch line missing": ("batch", lambda: history(batches=[batch(output=batch().output[:1])])),
    "a batch line failed": (
        "batch",
        lambda: history(
            batches=[batch(output=batch().output[:1], errors=[("line-101", "shutting_down")])]
        ),
    ),
    "a batch line's text differs": (
        "batch",
        lambda: history(batches=[batch(output=[("line-100", "a b c"), ("line-101", "a b")])]),
    ),
    "a batch not completed": ("batch", lambda: history(batches=[batch(status="expired")])),
    "a later batch's line failed": (
        "batch",
        lambda: history(batches=[batch(), batch(errors=[("line-100", "status 500")])]),
    ),
    "a 429 without retry-after": (
        "quota",
        lambda: history(native(request_id=None, outcome="refused", refused_status=429)),
    ),
    "a reservation left": (
        "quota",
        lambda: history(native(), quotas={"steady": {"reserved": 1, "inflight": 0}}),
    ),
    "a place at once left": (
        "quota",
        lambda: history(native(), quotas={"steady": {"reserved": 0, "inflight": 2}}),
    ),
    "tenant tokens counted twice": (
        "tenant-tokens",
        lambda: history(native(), tenant_tokens={"steady": 2 * TOKENS}),
    ),
    "tenant tokens not counted": (
        "tenant-tokens",
        lambda: history(native(), tenant_tokens={"steady": 0.0}),
    ),
    "tenant tokens of another tenant": (
        "tenant-tokens",
        lambda: history(native(), tenant_tokens={"steady": TOKENS, "flood": 3.0}),
    ),
    "a below-share request waited": (
        "wait",
        lambda: history(native(first_token_at=9.0), below_share=["steady"], wait_bound=4.0),
    ),
    "a below-share request waited across a worker's loss": (
        "wait",
        lambda: history(
            native(first_token_at=9.0),
            below_share=["steady"],
            wait_bound=4.0,
            faults=[Fault("worker-kill", ["worker1"], 1.5, 3.0)],
        ),
    ),
    "a native stream failed across a worker's SIGTERM": (
        "graceful",
        lambda: history(
            native(outcome="error", finish_reason="error", error_code="model_error"),
            faults=[TERM],
        ),
    ),
    "an OpenAI stream cut across an API's SIGTERM": (
        "graceful",
        lambda: history(
            openai(outcome="cut", finish_reason=None, text="a b", usage_tokens=None, api=API1),
            faults=[API_TERM],
        ),
    ),
    "an OpenAI stream ended shutting_down by an API that kept running": (
        "graceful",
        lambda: history(
            openai(1, **SHUT, api="http://api2:8000"),
            faults=[API_TERM],
        ),
    ),
    "a request refused (503) across a SIGTERM": (
        "graceful",
        lambda: history(
            native(request_id=None, outcome="refused", refused_status=503, record={}),
            faults=[TERM],
        ),
    ),
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


def test_tenants_quotas_waits_and_graceful_stops_pass_when_they_hold() -> None:
    flood = native(
        2,
        request_id=None,
        outcome="refused",
        refused_status=429,
        retry_after="1",
        record={},
        spec=Spec(2, "native", seed=1, prompt="p", max_tokens=4, tenant="flood"),
    )
    shut = openai(3, **SHUT, api=API1, record=_record("cancelled", "cancelled", 2, at=3.0))
    h = history(
        native(first_token_at=2.0),
        openai(1, api=API1),
        flood,
        shut,
        faults=[TERM, API_TERM],
        quotas={"steady": {"reserved": 0, "inflight": 0}, "flood": {"reserved": 0, "inflight": 0}},
        tenant_tokens={"steady": 2 * TOKENS + 2},  # the cancelled one may count its tokens
        below_share=["steady"],
        wait_bound=4.0,
        counters={"length": 2.0, "cancelled": 1.0},
    )
    assert check(h, reference) == []
    assert check(from_json(to_json(h)), reference) == []


def test_a_wait_across_a_fault_that_stops_everything_is_no_violation() -> None:
    stall = Fault("redis-pause", ["redis1"], 1.5, 4.0)
    h = history(native(first_token_at=9.0), below_share=["steady"], wait_bound=4.0, faults=[stall])
    assert check(h, reference) == []


def test_a_process_the_nemesis_killed_is_no_crash() -> None:
    h = history(native(), processes=[Process("worker1", 7, -9, by_nemesis=True)])
    assert check(h, reference) == []


def test_a_batch_lines_tokens_lost_with_a_killed_process_are_allowed_only_then() -> None:
    """A line whose record ended just before a kill may be uncounted (its process's
    unflushed second died with it); one that ended long before may not."""
    kill = Fault("worker-kill", ["worker1"], started_at=3.5, ended_at=5.0)
    lines = [("b0", 4), ("b1", 2)]
    just_before = batch(tokens=6, line_tokens=lines, finished={"b0": 3.0, "b1": 1.0})
    h = history(
        batches=[just_before],
        tenant_tokens={"default": 2.0},
        counters={"length": 1.0},
        faults=[kill],
    )
    assert check(h, reference) == []
    assert check(from_json(to_json(h)), reference) == []
    long_before = dataclasses.replace(just_before, finished={"b0": 1.0, "b1": 1.0})
    assert sorted(rules(dataclasses.replace(h, batches=[long_before]))) == [
        "metrics",
        "tenant-tokens",
    ]
