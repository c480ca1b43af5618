"""OpenAI stream chunks, parsed from the events of the project's one SSE reader.

The reader itself is :mod:`llmq.sse` (the worker reads its upstream through it
too); its names are re-exported here, so the load generator, the benchmarks and
the tests read llmq's streams through one module: :func:`frames` (events from
any async iterable of bytes), :class:`SSEDecoder`, :class:`Frame` and
:data:`DONE`. What this module adds is :func:`parse_chunk`, which reads one
event's data the OpenAI way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from llmq.sse import DONE as DONE
from llmq.sse import Frame as Frame
from llmq.sse import SSEDecoder as SSEDecoder
from llmq.sse import frames as frames
from loadgen.measurements import RequestFailed


@dataclass(frozen=True)
class Chunk:
    """One parsed stream event: content text, a usage report, or the end marker."""

    content: str = ""
    completion_tokens: int | None = None
    done: bool = False


def parse_chunk(data: str) -> Chunk:
    """Read one event's data: ``[DONE]``, an error object, or a completion chunk.

    Content is ``choices[0].text`` (completions) or ``choices[0].delta.content``
    (chat); either is accepted so one parser serves both endpoints. A usage
    object, usually in a final chunk with empty ``choices``, gives the output
    token count. Raises :class:`RequestFailed` on an error chunk (``server_error``)
    or undecodable data (``other``).
    """
    if data.strip() == DONE:
        return Chunk(done=True)
    try:
        obj = json.loads(data)
    except ValueError as exc:
        raise RequestFailed("other", f"undecodable stream chunk: {data[:200]!r}") from exc
    if not isinstance(obj, dict):
        raise RequestFailed("other", f"stream chunk is not an object: {data[:200]!r}")
    if obj.get("error") is not None:
        raise RequestFailed("server_error", _error_message(obj["error"]))
    return Chunk(content=_content(obj), completion_tokens=_completion_tokens(obj))


def _content(obj: dict[str, Any]) -> str:
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return ""
    choice = choices[0]
    text = choice.get("text")
    if isinstance(text, str):
        return text
    delta = choice.get("delta")
    if isinstance(delta, dict) and isinstance(delta.get("content"), str):
        return str(delta["content"])
    return ""


def _completion_tokens(obj: dict[str, Any]) -> int | None:
    usage = obj.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        return int(usage["completion_tokens"])
    return None


def _error_message(error: object) -> str:
    if isinstance(error, dict):
        message = error.get("message") or error.get("type") or json.dumps(error)
        return str(message)
    return str(error)
