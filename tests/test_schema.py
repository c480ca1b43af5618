"""The documented contract: events, records and jobs survive a trip through Redis."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from llmq.protocol.arq_job import deserialize, serialize_job
from llmq.protocol.queue import effective_score
from llmq.schema import (
    DoneEvent,
    ErrorEvent,
    JobPayload,
    RequestRecord,
    SamplingParams,
    StartedEvent,
    Timings,
    TokenLogprob,
    TokensEvent,
    Usage,
    decode_event,
    encode_event,
    is_terminal,
    tokens_event,
)

EVENTS = [
    StartedEvent(worker="w1", attempt=1, queue_ms=1.5),
    TokensEvent(index=3, tokens=[" a", " b"]),
    DoneEvent(
        finish_reason="length",
        usage=Usage(prompt_tokens=1, completion_tokens=2, total_tokens=3),
        timings=Timings(queue_ms=1, prefill_ms=2, decode_ms=3),
    ),
    ErrorEvent(code="model_error", message="boom"),
]


@pytest.mark.parametrize("event", EVENTS)
def test_event_round_trip(event: object) -> None:
    fields = encode_event(event)  # type: ignore[arg-type]
    assert fields["type"] == json.loads(fields["data"])["type"]
    assert decode_event(fields) == event
    assert decode_event({k.encode(): v.encode() for k, v in fields.items()}) == event


def test_a_token_event_built_without_validation_is_the_validated_one() -> None:
    """The workers build their token events with :func:`tokens_event` (no validation):
    the same event, fields set and encoding as pydantic's, with and without
    log-probabilities."""
    logprobs = [TokenLogprob(logprob=-0.5, top=[(" a", -0.5)]), TokenLogprob(logprob=-1.0)]
    for built, validated in (
        (tokens_event(3, [" a", " b"]), TokensEvent(index=3, tokens=[" a", " b"])),
        (
            tokens_event(3, [" a", " b"], logprobs),
            TokensEvent(index=3, tokens=[" a", " b"], logprobs=logprobs),
        ),
    ):
        assert built == validated
        assert built.model_fields_set == validated.model_fields_set
        assert encode_event(built) == encode_event(validated)
        assert encode_event(built)["data"] == validated.model_dump_json()
        assert decode_event(encode_event(built)) == validated


def test_terminal_events() -> None:
    assert [is_terminal(e) for e in EVENTS] == [False, False, True, True]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"type": "tokens"},
        {"data": "not json"},
        {"data": '{"type": "unknown"}'},
        {"data": '{"type": "tokens", "index": -1, "tokens": ["x"]}'},
        {"data": '{"type": "tokens", "index": 0, "tokens": []}'},
    ],
)
def test_malformed_entries_are_skipped(fields: dict[str, str]) -> None:
    assert decode_event(fields) is None


def test_record_round_trip() -> None:
    record = RequestRecord(
        id="abc", model="mock", status="done", priority=-2, created_at=1.5, completion_tokens=4
    )
    fields = record.to_redis()
    assert all(isinstance(v, str) for v in fields.values())
    assert RequestRecord.from_redis(fields) == record


def test_job_payload_is_an_arq_job() -> None:
    payload = JobPayload(
        request_id="r",
        model="mock",
        prompt="p",
        prompt_tokens=1,
        params=SamplingParams(max_tokens=3, stop=("x",)),
        enqueued_at=2.0,
        queue_deadline=5.0,
        generation_timeout=9.0,
    )
    job = deserialize(serialize_job(payload.model_dump(mode="json"), 2000))
    assert job["f"] == "generate" and job["et"] == 2000 and job["a"] == []
    assert JobPayload.model_validate(job["k"]["payload"]) == payload
    with pytest.raises(ValidationError):
        JobPayload.model_validate({**job["k"]["payload"], "surprise": 1})


def test_effective_score() -> None:
    assert effective_score(10_000, 0, 1000) == 10_000
    assert effective_score(10_000, 2, 1000) == 12_000
    assert effective_score(10_000, -3, 1000) == 7_000
    assert effective_score(10_000, -30, 1000) == 1  # never 0: arq ignores score 0
    assert effective_score(10_000, 5, 0) == 10_000
