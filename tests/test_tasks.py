"""The one run-forever loop: failures neither end it nor flood the log; cancel does."""

from __future__ import annotations

import asyncio
import logging

import pytest

from llmq.tasks import run_periodically
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(10)


async def test_a_failing_run_is_logged_once_and_the_loop_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runs: list[int] = []

    async def action() -> None:
        runs.append(len(runs))
        if 1 <= len(runs) <= 3:
            raise ConnectionError("redis is away")

    with caplog.at_level(logging.INFO, logger="llmq.tasks"):
        task = asyncio.create_task(run_periodically(action, 0.01, what="the chore"))
        await wait_until(lambda: len(runs) >= 5, timeout=5, what="five runs")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "llmq.tasks"]
    assert lines == [
        (logging.WARNING, "the chore failed: redis is away; retrying every 0.01s"),
        (logging.INFO, "the chore works again after 3 failed runs"),
    ]
