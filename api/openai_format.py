"""Shaping events into OpenAI's response bodies and SSE chunks.

Two flavours share one interface: text completions (``choices[].text``) and chat
completions (``choices[].delta`` / ``message``, with ``tool_calls``). Every chunk
names its choice's ``index``.

``finish_reason`` takes only values clients know: ``stop``, ``length``,
``tool_calls``, and vLLM's ``abort`` for a choice that llmq ended early
(cancelled, generation timeout), whose own reason is then in the extension field
``llmq_finish_reason``. (litellm maps unknown reasons to ``stop``, which made a
truncated answer look complete.)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii
from typing import Any

from api.admission.submit import Submitted
from api.streams import event_stream
from llmq.schema import PromptTokensDetails, TokenLogprob, Usage

#: The extension field that keeps llmq's own reason next to ``finish_reason: abort``.
LLMQ_FINISH_REASON = "llmq_finish_reason"


def usage_dict(usage: Usage | None) -> dict[str, Any] | None:
    return usage.model_dump() if usage else None


def openai_finish(reason: str, tool_called: bool = False) -> dict[str, str]:
    """The choice fields for llmq's finish ``reason``: OpenAI's value, and llmq's own
    reason in ``llmq_finish_reason`` where the two differ."""
    if reason == "stop" and tool_called:
        return {"finish_reason": "tool_calls"}
    if reason in ("stop", "length"):
        return {"finish_reason": reason}
    return {"finish_reason": "abort", LLMQ_FINISH_REASON: reason}


@dataclass
class ChoiceResult:
    """Everything one choice produced, for a non-streaming answer."""

    index: int
    text: list[str] = field(default_factory=list)
    finish: str = "stop"
    tool: tuple[str, str] | None = None
    arguments: list[str] = field(default_factory=list)
    logprobs: list[tuple[str, TokenLogprob]] | None = None


class UsageSum:
    """Usage of a response: each prompt's tokens once, every choice's completion."""

    def __init__(self) -> None:
        self.prompts: dict[int, int] = {}
        self.cached: dict[int, int] = {}
        self.completion = 0
        self.seen = False

    def add(self, sub: Submitted, usage: Usage | None) -> None:
        if usage is None:
            return
        self.seen = True
        self.prompts[sub.prompt_index] = usage.prompt_tokens
        if usage.prompt_tokens_details is not None:
            self.cached[sub.prompt_index] = usage.prompt_tokens_details.cached_tokens
        self.completion += usage.completion_tokens

    def total(self) -> Usage | None:
        if not self.seen:
            return None
        prompt = sum(self.prompts.values())
        details = None
        if self.cached:
            details = PromptTokensDetails(cached_tokens=sum(self.cached.values()))
        return Usage(
            prompt_tokens=prompt,
            completion_tokens=self.completion,
            total_tokens=prompt + self.completion,
            prompt_tokens_details=details,
        )


class CompletionFormat:
    object_full = "text_completion"
    object_chunk = "text_completion"
    id_prefix = "cmpl-"

    def __init__(
        self, subs: Sequence[Submitted], include_usage: bool, logprobs: bool = False
    ) -> None:
        self.subs = list(subs)
        self.sub = subs[0]
        self.include_usage = include_usage
        self.logprobs = logprobs
        self.id = self.id_prefix + self.sub.id
        self._frames: dict[int, tuple[bytes, bytes]] = {}
        #: Characters relayed so far per choice (the completions ``text_offset``).
        self._offsets: dict[int, int] = {}

    def delta_frame(self, text: str, index: int = 0) -> bytes:
        """``event_stream.data(self.delta(text, index))``, byte for byte, without re-encoding the
        envelope for every token: it is encoded once around a placeholder, and only
        the text is encoded per chunk (the hot path of every stream)."""
        frame = self._frames.get(index)
        if frame is None:
            placeholder = "\x00text\x00"
            whole = event_stream.data(self.delta(placeholder, index))
            prefix, _, suffix = whole.partition(json.dumps(placeholder).encode())
            frame = self._frames[index] = (prefix, suffix)
        prefix, suffix = frame
        # What ``json.dumps(text)`` returns, without its wrappers around the C encoder.
        return prefix + encode_basestring_ascii(text).encode() + suffix

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

    def _choice(
        self, index: int, text: str, finish: dict[str, str] | None, logprobs: Any = None
    ) -> dict[str, Any]:
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": None} | (
            finish or {}
        )

    def logprobs_of(self, index: int, tokens: list[tuple[str, TokenLogprob]]) -> Any:
        """The legacy completions ``logprobs`` object of ``tokens``."""
        offset = self._offsets.get(index, 0)
        offsets = []
        for token, _ in tokens:
            offsets.append(offset)
            offset += len(token)
        self._offsets[index] = offset
        return {
            "tokens": [t for t, _ in tokens],
            "token_logprobs": [lp.logprob for _, lp in tokens],
            "top_logprobs": [dict(lp.top) for _, lp in tokens],
            "text_offset": offsets,
        }

    def opening(self) -> list[dict[str, Any]]:
        """Chunks sent before any token (chat announces the role of each choice)."""
        return []

    def delta(
        self, text: str, index: int = 0, logprobs: list[tuple[str, TokenLogprob]] | None = None
    ) -> dict[str, Any]:
        shaped = self.logprobs_of(index, logprobs) if logprobs else None
        return self._envelope(self.object_chunk, [self._choice(index, text, None, shaped)])

    def tool_start(self, index: int, call_id: str, name: str) -> dict[str, Any] | None:
        """The chunk that opens a tool call (chat only)."""
        return None

    def tool_arguments(self, index: int, text: str) -> dict[str, Any]:
        return self.delta(text, index)

    def closing(self, finish: str, index: int = 0, tool_called: bool = False) -> dict[str, Any]:
        return self._envelope(
            self.object_chunk, [self._choice(index, "", openai_finish(finish, tool_called))]
        )

    def usage_chunk(self, usage: Usage | None) -> dict[str, Any]:
        body = self._envelope(self.object_chunk, [])
        body["usage"] = usage_dict(usage)
        return body

    def full(self, results: list[ChoiceResult], usage: Usage | None) -> dict[str, Any]:
        choices = [self._full_choice(r) for r in sorted(results, key=lambda r: r.index)]
        body = self._envelope(self.object_full, choices)
        body["usage"] = usage_dict(usage)
        return body

    def _full_choice(self, r: ChoiceResult) -> dict[str, Any]:
        shaped = self.logprobs_of(r.index, r.logprobs) if r.logprobs is not None else None
        text = "".join(r.text) + "".join(r.arguments)
        return self._choice(r.index, text, openai_finish(r.finish), shaped)


def _bytes(token: str) -> list[int]:
    return list(token.encode())


class ChatFormat(CompletionFormat):
    object_full = "chat.completion"
    object_chunk = "chat.completion.chunk"
    id_prefix = "chatcmpl-"

    def _delta_choice(
        self, index: int, delta: dict[str, Any], finish: dict[str, str] | None, logprobs: Any = None
    ) -> dict[str, Any]:
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": None} | (
            finish or {}
        )

    def logprobs_of(self, index: int, tokens: list[tuple[str, TokenLogprob]]) -> Any:
        return {
            "content": [
                {
                    "token": token,
                    "logprob": lp.logprob,
                    "bytes": _bytes(token),
                    "top_logprobs": [
                        {"token": t, "logprob": v, "bytes": _bytes(t)} for t, v in lp.top
                    ],
                }
                for token, lp in tokens
            ]
        }

    def opening(self) -> list[dict[str, Any]]:
        return [
            self._envelope(
                self.object_chunk,
                [self._delta_choice(s.index, {"role": "assistant", "content": ""}, None)],
            )
            for s in self.subs
        ]

    def delta(
        self, text: str, index: int = 0, logprobs: list[tuple[str, TokenLogprob]] | None = None
    ) -> dict[str, Any]:
        shaped = self.logprobs_of(index, logprobs) if logprobs else None
        return self._envelope(
            self.object_chunk, [self._delta_choice(index, {"content": text}, None, shaped)]
        )

    def tool_start(self, index: int, call_id: str, name: str) -> dict[str, Any] | None:
        call = {
            "index": 0,
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": ""},
        }
        return self._envelope(
            self.object_chunk, [self._delta_choice(index, {"tool_calls": [call]}, None)]
        )

    def tool_arguments(self, index: int, text: str) -> dict[str, Any]:
        call = {"index": 0, "function": {"arguments": text}}
        return self._envelope(
            self.object_chunk, [self._delta_choice(index, {"tool_calls": [call]}, None)]
        )

    def closing(self, finish: str, index: int = 0, tool_called: bool = False) -> dict[str, Any]:
        return self._envelope(
            self.object_chunk,
            [self._delta_choice(index, {}, openai_finish(finish, tool_called))],
        )

    def _full_choice(self, r: ChoiceResult) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(r.text)}
        if r.tool is not None:
            call_id, name = r.tool
            message["content"] = message["content"] or None
            message["tool_calls"] = [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": "".join(r.arguments)},
                }
            ]
        shaped = self.logprobs_of(r.index, r.logprobs) if r.logprobs is not None else None
        return {"index": r.index, "message": message, "logprobs": shaped, "finish_reason": None} | (
            openai_finish(r.finish, r.tool is not None)
        )
