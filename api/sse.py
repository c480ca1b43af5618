"""Server-Sent Events framing."""

from __future__ import annotations

import json
from typing import Any

KEEPALIVE = b": keepalive\n\n"
DONE = b"data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
MEDIA_TYPE = "text/event-stream"


def data(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def event(event_id: str, kind: str, payload: str) -> bytes:
    return f"id: {event_id}\nevent: {kind}\ndata: {payload}\n\n".encode()
