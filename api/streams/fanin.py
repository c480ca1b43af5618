"""Following the requests of one response's choices as one sequence of events.

With ``n`` > 1 or a list of prompts every choice is its own request in the queue
(so priority, cancellation and crash recovery work per choice); the response
relays their streams together. :func:`merged` yields ``(choice index, batch)`` in
arrival order, each choice's events in its own order, and ends once every choice
has ended.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence

from api.admission.submit import Submitted
from api.state import AppState
from api.streams.follow import Batch, follow
from llmq.tasks import stop_tasks

Item = Batch | None


class _End:
    """A choice's stream ended."""


async def merged(
    state: AppState, subs: Sequence[Submitted]
) -> AsyncGenerator[tuple[int, Item], None]:
    """Batches of events of every choice; ``(index, IDLE)`` marks a keep-alive tick."""
    if len(subs) == 1:  # the common case: no tasks, no queue
        async for item in follow(state, subs[0].id):
            yield subs[0].index, item
        return
    inbox: asyncio.Queue[tuple[int, Item | _End | Exception]] = asyncio.Queue()

    async def pump(sub: Submitted) -> None:
        try:
            async for item in follow(state, sub.id):
                inbox.put_nowait((sub.index, item))
            inbox.put_nowait((sub.index, _End()))
        except Exception as exc:  # surfaced to the consumer, which owns the response
            inbox.put_nowait((sub.index, exc))

    tasks = [asyncio.create_task(pump(sub)) for sub in subs]
    try:
        running = len(tasks)
        while running:
            index, got = await inbox.get()
            if isinstance(got, _End):
                running -= 1
            elif isinstance(got, Exception):
                raise got
            else:
                yield index, got
    finally:
        await stop_tasks(tasks, timeout=2)
