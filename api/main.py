"""The API process: uvicorn serving :func:`api.app.create_app`."""

from __future__ import annotations

import uvicorn

from api.app import create_app
from llmq.settings import ApiSettings


def serve(settings: ApiSettings) -> None:
    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=5,
        lifespan="on",
    )
    uvicorn.Server(config).run()
