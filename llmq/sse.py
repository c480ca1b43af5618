"""Server-sent events, decoded incrementally: the one SSE reader of the project.

The load generator, the benchmarks and the tests read llmq's streams through it
(re-exported by :mod:`loadgen.sse`, which adds OpenAI chunk parsing), and a worker
reads its upstream inference server's stream through it. Network reads cut the
stream anywhere: inside a UTF-8 character, between ``\\r`` and ``\\n``, in the
middle of a ``data:`` line. :class:`SSEDecoder` is fed raw bytes as they arrive and
returns only complete events, per the SSE spec (lines end in ``\\n``, ``\\r\\n`` or
``\\r``; a blank line dispatches the event; lines starting with ``:`` are comments
such as keep-alives; multi-line ``data`` joins with ``\\n``; an event without
``data`` is not dispatched). :func:`frames` does the same over any async iterable
of bytes (``httpx``'s ``aiter_bytes()``, ``aiohttp``'s ``content.iter_any()``).
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from typing import Any

_EOL = re.compile(r"\r\n|\r|\n")
DONE = "[DONE]"


@dataclass(frozen=True)
class Frame:
    """One dispatched event: its ``id`` and ``event`` fields (None when absent) and data."""

    id: str | None
    event: str | None
    data: str

    def json(self) -> Any:
        return json.loads(self.data)


class SSEDecoder:
    """Bytes in, complete events out."""

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buffer = ""
        self._data: list[str] = []
        self._id: str | None = None
        self._event: str | None = None

    def feed(self, chunk: bytes) -> list[Frame]:
        """Add one network read; return every event it completed.

        Servers end lines with ``\n`` (llama.cpp, vLLM, llmq itself): while no ``\r``
        is in sight the lines are cut with one ``split``, the decoder's cost on every
        token a worker reads from its upstream; otherwise with the spec's three
        line ends.
        """
        self._buffer += self._utf8.decode(chunk)
        events: list[Frame] = []
        if "\r" not in self._buffer:
            lines = self._buffer.split("\n")
            self._buffer = lines.pop()  # the unterminated rest ("" after a line end)
            for line in lines:
                self._line(line, events)
            return events
        pos = 0
        while (match := _EOL.search(self._buffer, pos)) is not None:
            if match.group() == "\r" and match.end() == len(self._buffer):
                break  # maybe the first half of "\r\n": wait for the next read
            self._line(self._buffer[pos : match.start()], events)
            pos = match.end()
        self._buffer = self._buffer[pos:]
        return events

    def close(self) -> list[Frame]:
        """End of stream: flush a last unterminated line and a pending event.

        The spec drops an event the stream ended inside; being lenient here costs
        nothing and keeps a final ``data: [DONE]`` without a blank line.
        """
        events: list[Frame] = []
        tail = self._buffer + self._utf8.decode(b"", final=True)
        self._buffer = ""
        for line in _EOL.split(tail):
            if line:
                self._line(line, events)
        self._line("", events)
        return events

    def _line(self, line: str, events: list[Frame]) -> None:
        if line.startswith("data: "):  # nearly every line that is not blank
            self._data.append(line[6:])
            return
        if not line:
            if self._data:
                events.append(Frame(self._id, self._event, "\n".join(self._data)))
            self._data, self._id, self._event = [], None, None
            return
        if line.startswith(":"):
            return  # comment / keep-alive
        name, _, value = line.partition(":")  # a line without ":" is a field with value ""
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            self._data.append(value)
        elif name == "id":
            self._id = value
        elif name == "event":
            self._event = value


async def frames(chunks: AsyncIterable[bytes]) -> AsyncIterator[Frame]:
    """The events of a byte stream, in arrival order, each as soon as it is complete."""
    decoder = SSEDecoder()
    async for chunk in chunks:
        for frame in decoder.feed(chunk):
            yield frame
    for frame in decoder.close():
        yield frame
