"""The incremental SSE decoder (the one reader of SSE streams) and the OpenAI chunk parser."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from loadgen.measurements import RequestFailed
from loadgen.sse import Frame, SSEDecoder, frames, parse_chunk


def _event(obj: object) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


STREAM = (
    ": keep-alive\n\n"
    + _event({"choices": [{"index": 0, "text": " héllo"}]})
    + ": ping\r\n\r\n"
    + _event({"choices": [{"index": 0, "text": " wörld ✓"}]}).replace("\n", "\r\n")
    + "event: message\nid: 3\nretry: 10\n"
    + _event({"choices": [{"index": 0, "text": ""}]})
    + _event({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 3}})
    + "data: [DONE]\n\n"
).encode()

EXPECTED = [
    json.dumps({"choices": [{"index": 0, "text": " héllo"}]}, ensure_ascii=False),
    json.dumps({"choices": [{"index": 0, "text": " wörld ✓"}]}, ensure_ascii=False),
    json.dumps({"choices": [{"index": 0, "text": ""}]}, ensure_ascii=False),
    json.dumps({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 3}}),
    "[DONE]",
]


def _decode(pieces: list[bytes]) -> list[str]:
    decoder = SSEDecoder()
    events: list[str] = []
    for piece in pieces:
        events += [frame.data for frame in decoder.feed(piece)]
    return events + [frame.data for frame in decoder.close()]


def _data(frames: list[Frame]) -> list[str]:
    return [frame.data for frame in frames]


def test_whole_stream_decodes() -> None:
    assert _decode([STREAM]) == EXPECTED


def test_every_two_way_split_decodes_the_same() -> None:
    # Covers splits inside "data:", inside a UTF-8 character and between \r and \n.
    for cut in range(1, len(STREAM)):
        assert _decode([STREAM[:cut], STREAM[cut:]]) == EXPECTED, cut


def test_byte_by_byte_decodes_the_same() -> None:
    assert _decode([STREAM[i : i + 1] for i in range(len(STREAM))]) == EXPECTED


def test_events_come_out_as_soon_as_they_are_complete() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b'data: {"a": 1}\n') == []
    assert _data(decoder.feed(b"\n")) == ['{"a": 1}']
    assert decoder.feed(b"data: x\r") == []  # a lone \r may be half of \r\n
    assert decoder.feed(b"\r") == []  # ...here it was a line end, then an empty line
    assert _data(decoder.feed(b"\n")) == ["x"]


async def test_id_and_event_fields_belong_to_their_event() -> None:
    async def pieces() -> AsyncIterator[bytes]:
        yield b"id: 1-0\nevent: tokens\ndata: {}\n"
        yield b"\nid: 2-0\nevent: done\ndata: x\n\ndata: bare\n\n"

    assert [frame async for frame in frames(pieces())] == [
        Frame("1-0", "tokens", "{}"),
        Frame("2-0", "done", "x"),
        Frame(None, None, "bare"),
    ]
    assert Frame("1", None, '{"a": [1]}').json() == {"a": [1]}


def test_multiline_data_and_missing_final_blank_line() -> None:
    assert _decode([b"data: one\ndata:two\n\n", b"data: [DONE]"]) == ["one\ntwo", "[DONE]"]
    assert _decode([b": only a comment\n\n"]) == []


def test_parse_completion_chat_usage_and_done() -> None:
    assert parse_chunk('{"choices": [{"text": " a"}]}').content == " a"
    chat = '{"choices": [{"delta": {"content": " b"}, "index": 0}]}'
    assert parse_chunk(chat).content == " b"
    role_only = '{"choices": [{"delta": {"role": "assistant"}, "index": 0}]}'
    assert parse_chunk(role_only).content == ""
    assert parse_chunk('{"choices": [{"delta": {"content": null}}]}').content == ""
    usage = parse_chunk('{"choices": [], "usage": {"completion_tokens": 7}}')
    assert (usage.content, usage.completion_tokens) == ("", 7)
    assert parse_chunk("[DONE]").done
    assert not parse_chunk(EXPECTED[0]).done


def test_error_chunk_is_a_server_error() -> None:
    with pytest.raises(RequestFailed) as caught:
        parse_chunk('{"error": {"message": "worker died", "type": "internal_error"}}')
    assert caught.value.kind == "server_error"
    assert "worker died" in caught.value.message


def test_garbage_chunk_is_other() -> None:
    for data in ("{not json", "[1, 2]"):
        with pytest.raises(RequestFailed) as caught:
            parse_chunk(data)
        assert caught.value.kind == "other"
