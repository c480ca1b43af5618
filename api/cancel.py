"""Cancelling requests: on client disconnect, or by ``DELETE /v1/requests/{id}``.

A queued request is removed and ended with ``finish_reason: cancelled``; a running
one is stopped by its worker within about one token interval. Work triggered by a
disconnect runs as a background task owned by the app state, because the request's
own task is being torn down.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import TypeVar

from fastapi import Request

from api.state import AppState

log = logging.getLogger(__name__)

T = TypeVar("T")


async def cancel(state: AppState, model: str, request_id: str) -> bool:
    """True if the request was still queued."""
    was_queued = await state.queue.cancel(model, request_id)
    log.info(
        "cancelled request %s (%s)",
        request_id,
        "queued" if was_queued else "running or done",
        extra={"request_id": request_id},
    )
    return was_queued


async def _release(state: AppState, model: str, request_id: str, cancelled: bool) -> None:
    if cancelled:
        await cancel(state, model, request_id)
    await state.queue.detach(state.process_id, request_id, model)


def release_later(state: AppState, model: str, request_id: str, *, cancel: bool) -> None:
    """An attached request's client is done (``cancel``: it left before the end)."""
    state.spawn(_release(state, model, request_id, cancel))


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T | None:
    """``work``'s result, or None if the client went away first (``work`` is cancelled)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, gone):
            if not t.done():
                t.cancel()
        await asyncio.gather(task, gone, return_exceptions=True)
    if task.cancelled():
        return None
    return task.result()
