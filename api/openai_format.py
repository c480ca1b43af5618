"""Shaping events into OpenAI's response bodies and SSE chunks.

Two flavours share one interface: text completions (``choices[].text``) and chat
completions (``choices[].delta`` / ``message``).
"""

from __future__ import annotations

import json
from typing import Any

from api import sse
from api.submit import Submitted
from llmq.schema import Usage


def usage_dict(usage: Usage | None) -> dict[str, int] | None:
    return usage.model_dump() if usage else None


class CompletionFormat:
    object_full = "text_completion"
    object_chunk = "text_completion"
    id_prefix = "cmpl-"

    def __init__(self, sub: Submitted, include_usage: bool) -> None:
        self.sub = sub
        self.include_usage = include_usage
        self.id = self.id_prefix + sub.id
        self._frame: tuple[bytes, bytes] | None = None

    def delta_frame(self, text: str) -> bytes:
        """``sse.data(self.delta(text))``, byte for byte, without re-encoding the
        envelope for every token: it is encoded once around a placeholder, and only
        the text is encoded per chunk (the hot path of every stream)."""
        if self._frame is None:
            placeholder = "\x00text\x00"
            whole = sse.data(self.delta(placeholder))
            prefix, _, suffix = whole.partition(json.dumps(placeholder).encode())
            self._frame = (prefix, suffix)
        prefix, suffix = self._frame
        return prefix + json.dumps(text).encode() + suffix

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "object": obj,
            "created": self.sub.created,
            "model": self.sub.model,
            "choices": choices,
        }
        if self.include_usage:
            body["usage"] = None
        return body

    def _choice(self, text: str, finish: str | None) -> dict[str, Any]:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

    def opening(self) -> dict[str, Any] | None:
        """A chunk sent before any token (chat announces the role); None for none."""
        return None

    def delta(self, text: str) -> dict[str, Any]:
        return self._envelope(self.object_chunk, [self._choice(text, None)])

    def closing(self, finish: str) -> dict[str, Any]:
        return self._envelope(self.object_chunk, [self._choice("", finish)])

    def usage_chunk(self, usage: Usage | None) -> dict[str, Any]:
        body = self._envelope(self.object_chunk, [])
        body["usage"] = usage_dict(usage)
        return body

    def full(self, text: str, finish: str, usage: Usage | None) -> dict[str, Any]:
        body = self._envelope(self.object_full, [self._full_choice(text, finish)])
        body["usage"] = usage_dict(usage)
        return body

    def _full_choice(self, text: str, finish: str) -> dict[str, Any]:
        return self._choice(text, finish)


class ChatFormat(CompletionFormat):
    object_full = "chat.completion"
    object_chunk = "chat.completion.chunk"
    id_prefix = "chatcmpl-"

    def _delta_choice(self, delta: dict[str, str], finish: str | None) -> dict[str, Any]:
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

    def opening(self) -> dict[str, Any] | None:
        return self._envelope(
            self.object_chunk, [self._delta_choice({"role": "assistant", "content": ""}, None)]
        )

    def delta(self, text: str) -> dict[str, Any]:
        return self._envelope(self.object_chunk, [self._delta_choice({"content": text}, None)])

    def closing(self, finish: str) -> dict[str, Any]:
        return self._envelope(self.object_chunk, [self._delta_choice({}, finish)])

    def _full_choice(self, text: str, finish: str) -> dict[str, Any]:
        return {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish,
        }
