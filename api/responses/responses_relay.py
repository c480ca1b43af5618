"""Following one Responses request: its chat events become the output and typed events.

:class:`ResponseRelay` takes the request's events in order (tokens without gaps
or repeats, through :class:`api.routes.openai.RelayedChoice`) and keeps what the
response holds so far; when streaming it also returns the SSE frames of each
event: an output item is announced when its first text (or the tool call) arrives
and closed before the next item or the terminal event.
"""

from __future__ import annotations

from typing import Any

from api.admission.submit import Submitted
from api.responses.responses_format import Output, ResponseFormat
from api.routes.openai import RelayedChoice
from llmq.schema import DoneEvent, ErrorEvent, Event, TokensEvent, ToolCallEvent

#: The terminal stream event of each final status.
TERMINAL_EVENTS = {"completed": "response.completed", "incomplete": "response.incomplete"}


class ResponseRelay:
    def __init__(self, fmt: ResponseFormat, sub: Submitted, streaming: bool) -> None:
        self.fmt = fmt
        self.choice = RelayedChoice(sub)
        self.out = Output()
        self.streaming = streaming
        #: Output items announced so far; which of them is still open.
        self.items = 0
        self.open: str | None = None
        #: The final Response object, once the terminal event arrived.
        self.final: dict[str, Any] | None = None
        #: The terminal event was an error: its event, for a non-streaming answer.
        self.error: ErrorEvent | None = None

    @property
    def finished(self) -> bool:
        return self.final is not None

    def opening(self) -> bytes:
        snapshot = self.fmt.response("in_progress", [])
        return self.fmt.event("response.created", {"response": snapshot}) + self.fmt.event(
            "response.in_progress", {"response": snapshot}
        )

    def take(self, event: Event) -> list[bytes]:
        """Take one event into the output; its frames (none when not streaming)."""
        frames: list[bytes] = []
        if isinstance(event, TokensEvent):
            text, arguments, _ = self.choice.take(event)
            if text:
                self._text("".join(text), frames)
            if arguments:
                self._arguments("".join(arguments), frames)
        elif isinstance(event, ToolCallEvent):
            if self.choice.tool(event):
                self._call(event, frames)
        elif isinstance(event, DoneEvent):
            self.choice.finished = True
            self._close("completed" if event.finish_reason == "stop" else "incomplete", frames)
            self.final = self.fmt.final(self.out, event.finish_reason, event.usage)
            self._terminal(frames)
        elif isinstance(event, ErrorEvent):
            self.choice.finished = True
            self.error = event
            self._close("incomplete", frames)
            self.final = self.fmt.failed(self.out, event.code, event.message, event.usage)
            self._terminal(frames)
        return frames

    def _text(self, text: str, frames: list[bytes]) -> None:
        self.out.text.append(text)
        if not self.streaming:
            return
        if self.open != "message":
            self._announce("message", self.fmt.message_item("", "in_progress"), frames)
            frames.append(self._part_event("response.content_part.added", ""))
        frames.append(self.fmt.text_delta(text))

    def _arguments(self, text: str, frames: list[bytes]) -> None:
        self.out.arguments.append(text)
        if self.streaming:
            where = {"item_id": self.fmt.call_item_id, "output_index": self.items - 1}
            frames.append(
                self.fmt.event("response.function_call_arguments.delta", where | {"delta": text})
            )

    def _call(self, event: ToolCallEvent, frames: list[bytes]) -> None:
        self.out.call = (event.id, event.name)
        if self.streaming:
            self._close("completed", frames)
            item = self.fmt.call_item(self.out.call, "", "in_progress")
            self._announce("function_call", item, frames)

    def _announce(self, kind: str, item: dict[str, Any], frames: list[bytes]) -> None:
        frames.append(
            self.fmt.event("response.output_item.added", {"output_index": self.items, "item": item})
        )
        self.items += 1
        self.open = kind

    def _part_event(self, kind: str, text: str) -> bytes:
        where = {"item_id": self.fmt.message_id, "output_index": self.items - 1}
        part = self.fmt.text_part(text)
        return self.fmt.event(kind, where | {"content_index": 0, "part": part})

    def _close(self, status: str, frames: list[bytes]) -> None:
        """Close the open output item (when streaming)."""
        if not self.streaming or self.open is None:
            return
        index = self.items - 1
        if self.open == "message":
            text = "".join(self.out.text)
            where = {"item_id": self.fmt.message_id, "output_index": index, "content_index": 0}
            frames.append(
                self.fmt.event("response.output_text.done", where | {"text": text, "logprobs": []})
            )
            frames.append(self._part_event("response.content_part.done", text))
            item = self.fmt.message_item(text, status)
        else:
            call = self.out.call or ("", "")  # a call item is open only once a call arrived
            arguments = "".join(self.out.arguments)
            where = {"item_id": self.fmt.call_item_id, "output_index": index}
            fields = where | {"name": call[1], "arguments": arguments}
            frames.append(self.fmt.event("response.function_call_arguments.done", fields))
            item = self.fmt.call_item(call, arguments, status)
        frames.append(
            self.fmt.event("response.output_item.done", {"output_index": index, "item": item})
        )
        self.open = None

    def _terminal(self, frames: list[bytes]) -> None:
        if not self.streaming or self.final is None:
            return
        kind = TERMINAL_EVENTS.get(str(self.final["status"]), "response.failed")
        frames.append(self.fmt.event(kind, {"response": self.final}))

    def assistant_message(self) -> dict[str, Any]:
        """The output as a chat message, for the stored conversation."""
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.out.text) or None}
        if self.out.call is not None:
            call_id, name = self.out.call
            function = {"name": name, "arguments": "".join(self.out.arguments)}
            message["tool_calls"] = [{"id": call_id, "type": "function", "function": function}]
        return message
