"""Structured logs: one JSON object per line, carrying the request id."""

from __future__ import annotations

import io
import json
import logging

import pytest

from llmq.logs import setup_logging
from llmq.settings import CommonSettings
from tests.support.servers import StartApi, StartWorker


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


@pytest.mark.timeout(30)
async def test_prompts_reach_the_logs_only_when_asked_for(
    start_api: StartApi, start_worker: StartWorker, caplog: pytest.LogCaptureFixture
) -> None:
    await start_worker()
    quiet = await start_api()
    chatty = await start_api(log_prompts=True)
    body = {"model": "mock", "max_tokens": 1}
    with caplog.at_level(logging.INFO, logger="api.admission.submit"):
        async with quiet.client() as client:
            r = await client.post("/v1/completions", json={**body, "prompt": "secret one"})
            assert r.status_code == 200, r.text
        async with chatty.client() as client:
            r = await client.post("/v1/completions", json={**body, "prompt": "secret two"})
            assert r.status_code == 200, r.text
    logged = "\n".join(rec.getMessage() for rec in caplog.records)
    assert "accepted request" in logged  # the records were captured at all
    assert "secret one" not in logged
    assert "secret two" in logged
