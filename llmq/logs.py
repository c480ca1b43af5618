"""Logging set-up shared by every process: plain text or one JSON object per line.

A ``request_id`` passed with ``extra={"request_id": ...}`` is carried into the
JSON output, so one request can be followed from the API through the worker.
"""

from __future__ import annotations

import json
import logging
import sys
import time

from llmq.settings import CommonSettings

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def __init__(self, process_name: str) -> None:
        super().__init__()
        self.process_name = process_name

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": round(record.created, 6),
            "level": record.levelname,
            "logger": record.name,
            "process": self.process_name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(settings: CommonSettings, process_name: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if settings.log_json:
        handler.setFormatter(JsonFormatter(process_name))
    else:
        fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
        fmt.converter = time.gmtime
        handler.setFormatter(fmt)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level)
    # arq logs every job start and end at INFO; keep it for debugging only.
    logging.getLogger("arq").setLevel(max(logging.WARNING, root.level))
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
