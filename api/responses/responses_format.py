"""Shaping a chat request's events into Responses API objects and typed stream events.

One response has one output: a message (``output_text``), or a function call
(``function_call`` with its JSON ``arguments``), or a message then a call when the
model wrote text before calling. A stream is OpenAI's sequence of typed events
(``event: response.output_text.delta`` ...), each with its ``sequence_number``:
``response.created``, ``response.in_progress``, per output item ``added`` / deltas
/ ``done``, then one of ``response.completed``, ``response.incomplete`` (the token
limit) or ``response.failed``. It has no ``[DONE]``.

``status`` maps llmq's finish reasons: ``stop`` is ``completed``, ``length`` is
``incomplete`` (``incomplete_details.reason: max_output_tokens``), ``cancelled``
is ``cancelled``; an error is ``failed`` with ``error: {code, message}``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii
from typing import Any

from api.responses.responses_input import NamedFunctionChoice, ResponsesRequest
from llmq.schema import Usage

#: The extension field that keeps llmq's own finish reason where ``status`` says less.
LLMQ_FINISH_REASON = "llmq_finish_reason"


def response_usage(usage: Usage | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    details = usage.prompt_tokens_details
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": details.cached_tokens if details else 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.total_tokens,
    }


@dataclass
class Output:
    """What the model produced so far: text, and a function call with its arguments."""

    text: list[str] = field(default_factory=list)
    call: tuple[str, str] | None = None
    arguments: list[str] = field(default_factory=list)


class ResponseFormat:
    """The Response object of one request and, when streaming, its typed events."""

    def __init__(self, body: ResponsesRequest, request_id: str, created: int, model: str) -> None:
        self.body = body
        self.id = "resp_" + request_id
        self.message_id = "msg_" + request_id
        self.call_item_id = "fc_" + request_id
        self.created = created
        self.model = model
        self.sequence = 0
        #: The delta event's bytes around its sequence number, once built.
        self._delta_prefix = self._delta_middle = b""

    # --- the Response object -------------------------------------------------------

    def _text_format(self) -> dict[str, Any]:
        fmt = self.body.text.format if self.body.text is not None else None
        if fmt is None:
            return {"type": "text"}
        return fmt.model_dump(by_alias=True, exclude_none=True)

    def _tools(self) -> list[dict[str, Any]]:
        return [t.model_dump(exclude_none=True) for t in self.body.tools or ()]

    def _tool_choice(self) -> Any:
        choice = self.body.tool_choice
        return choice.model_dump() if isinstance(choice, NamedFunctionChoice) else choice or "auto"

    def response(
        self,
        status: str,
        output: list[dict[str, Any]],
        usage: Usage | None = None,
        *,
        finish: str | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        b = self.body
        incomplete = {"reason": "max_output_tokens"} if finish == "length" else None
        body: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": error,
            "incomplete_details": incomplete,
            "instructions": b.instructions,
            "max_output_tokens": b.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": b.parallel_tool_calls is not False,
            "previous_response_id": b.previous_response_id,
            "reasoning": {"effort": None, "summary": None},
            "store": b.storing,
            "temperature": 1.0 if b.temperature is None else b.temperature,
            "text": {"format": self._text_format()},
            "tool_choice": self._tool_choice(),
            "tools": self._tools(),
            "top_p": 1.0 if b.top_p is None else b.top_p,
            "truncation": b.truncation or "disabled",
            "usage": response_usage(usage),
            "user": b.user,
            "metadata": b.metadata or {},
        }
        if finish is not None and finish not in ("stop", "length"):
            body[LLMQ_FINISH_REASON] = finish
        return body

    def message_item(self, text: str, status: str) -> dict[str, Any]:
        return {
            "type": "message",
            "id": self.message_id,
            "status": status,
            "role": "assistant",
            "content": [] if status == "in_progress" else [self.text_part(text)],
        }

    @staticmethod
    def text_part(text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def call_item(self, call: tuple[str, str], arguments: str, status: str) -> dict[str, Any]:
        call_id, name = call
        return {
            "type": "function_call",
            "id": self.call_item_id,
            "call_id": call_id,
            "name": name,
            "arguments": arguments,
            "status": status,
        }

    def output(self, out: Output, status: str = "completed") -> list[dict[str, Any]]:
        """The output items of ``out`` (a message only if it has text or nothing else)."""
        items = []
        text = "".join(out.text)
        if text or out.call is None:
            items.append(self.message_item(text, status))
        if out.call is not None:
            items.append(self.call_item(out.call, "".join(out.arguments), status))
        return items

    def final(self, out: Output, finish: str, usage: Usage | None) -> dict[str, Any]:
        """The finished response: completed, incomplete (length) or cancelled."""
        status = {"stop": "completed", "length": "incomplete"}.get(finish, "cancelled")
        item_status = "completed" if status == "completed" else "incomplete"
        return self.response(status, self.output(out, item_status), usage, finish=finish)

    def failed(self, out: Output, code: str, message: str, usage: Usage | None) -> dict[str, Any]:
        error = {"code": code, "message": message}
        return self.response("failed", self.output(out, "incomplete"), usage, error=error)

    # --- stream events -------------------------------------------------------------

    def event(self, kind: str, fields: dict[str, Any]) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        data = json.dumps(payload, separators=(",", ":"))
        return f"event: {kind}\ndata: {data}\n\n".encode()

    def text_delta(self, text: str) -> bytes:
        """``response.output_text.delta`` of ``text``, byte for byte what :meth:`event`
        makes, with only the sequence number and the text encoded per token."""
        if not self._delta_prefix:
            where = {"item_id": self.message_id, "output_index": 0, "content_index": 0}
            head = json.dumps(where, separators=(",", ":"))[1:-1]
            self._delta_prefix = (
                b"event: response.output_text.delta\n"
                b'data: {"type":"response.output_text.delta","sequence_number":'
            )
            self._delta_middle = f',{head},"delta":'.encode()
        number = str(self.sequence).encode()
        self.sequence += 1
        text_json = encode_basestring_ascii(text).encode()
        return self._delta_prefix + number + self._delta_middle + text_json + b',"logprobs":[]}\n\n'
