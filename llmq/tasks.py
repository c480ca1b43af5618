"""Background tasks: running one forever, and stopping them reliably.

:func:`run_periodically` is the one "do this every few seconds until cancelled"
loop (the metrics flush, the API's worker catalog...): a failing run does not end
the task, and an outage is logged once when it starts and once when it ends, not
at every run.

A single ``Task.cancel()`` is not always enough: a cancellation that races with a
timeout inside a library (a Redis read under ``asyncio.timeout``, say) can be
absorbed, and a ``while True`` loop then carries on. :func:`stop_tasks`
repeats the cancel until the tasks are done or the deadline passes, and logs the
stack of any task that would not stop instead of hanging shutdown.
"""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, NoReturn

from llmq.outage import Outage

log = logging.getLogger(__name__)

#: How often :func:`stop_tasks` cancels again a task that has not stopped yet.
REPEAT_SECONDS = 0.1


async def run_periodically(
    action: Callable[[], Awaitable[object]],
    interval: float,
    *,
    what: str,
    logger: logging.Logger = log,
) -> NoReturn:
    """Run ``action`` now and then every ``interval`` seconds, until cancelled.

    An exception from ``action`` is logged as an :class:`llmq.outage.Outage` is
    (a warning for the first failure of a run of them, an info line when ``action``
    works again) and the next run comes at the usual interval; only cancellation
    ends the loop.
    """
    outage = Outage(
        logger,
        lost=f"{_literal(what)} failed: %s; retrying every {interval:g}s",
        back=f"{_literal(what)} works again after %d failed runs",
    )
    while True:
        try:
            await action()
        except Exception as exc:
            outage.note(exc)  # the pace stays ``interval``: no backoff
        else:
            outage.recovered()
        await asyncio.sleep(interval)


def _literal(text: str) -> str:
    """``text`` as a part of a %-format that prints it as it is."""
    return text.replace("%", "%%")


async def stop_tasks(
    tasks: Iterable[asyncio.Task[Any]], timeout: float, *, repeat: bool = True
) -> None:
    """Stop ``tasks``: cancel them and await them for at most ``timeout`` seconds.

    ``repeat=False`` cancels once: for tasks that clean up (shielded) after a
    cancel and must not be interrupted while doing so.
    """
    pending = {t for t in tasks if not t.done()}
    for task in pending:
        task.cancel()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while pending and loop.time() < deadline:
        if repeat:
            for task in pending:
                task.cancel()
        _, pending = await asyncio.wait(
            pending, timeout=min(REPEAT_SECONDS, deadline - loop.time())
        )
    for task in pending:
        out = io.StringIO()
        task.print_stack(file=out)
        log.error(
            "task %s did not stop within %.0fs:\n%s", task.get_name(), timeout, out.getvalue()
        )
