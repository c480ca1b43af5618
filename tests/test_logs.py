"""Structured logs: one JSON object per line, carrying the request id."""

from __future__ import annotations

import io
import json
import logging

import pytest

from llmq.logs import setup_logging
from llmq.settings import CommonSettings


def test_json_lines_carry_the_request_id(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        setup_logging(CommonSettings(log_json=True), "worker")
        logging.getLogger("worker.runner").info(
            "request %s finished", "abc", extra={"request_id": "abc", "event": "finished"}
        )
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])
    line = json.loads(stream.getvalue().strip().splitlines()[-1])
    assert line["request_id"] == "abc" and line["process"] == "worker"
    assert line["message"] == "request abc finished" and line["level"] == "INFO"
