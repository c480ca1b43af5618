"""Following one request's stream: events in order, tokens without gaps or repeats.

A request re-run after a worker failure resumes after the tokens already in its
stream, but an index can still appear twice (a stopping worker's last write racing
its re-run, or tokens a dead worker generated but never wrote); :class:`TokenCursor`
drops what was already relayed, so a client sees each token exactly once.
:func:`follow` yields the events that arrived together as one batch (a response
writes them in one send), ends after the terminal event, and ends with an ``expired`` error if
the request's record vanished while the stream was idle. A client resuming at or past
the terminal event (it already has the end) gets nothing, and the stream ends at once.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from api.state import AppState
from api.streams.subscription import parse_id
from llmq.protocol import keys
from llmq.protocol.streams import final_event_id
from llmq.schema import ErrorEvent, Event, TokensEvent, is_terminal

log = logging.getLogger(__name__)

#: Yielded by :func:`follow` when the stream was idle for a keep-alive interval.
IDLE = None


class TokenCursor:
    """Tracks the next token index a client expects."""

    def __init__(self, next_index: int = 0) -> None:
        self.next_index = next_index

    def take(self, event: TokensEvent) -> list[str]:
        """The tokens of ``event`` not relayed yet: the event's own list when none was
        (nearly always; not copied, so not to be changed)."""
        skip = self.next_index - event.index
        if skip < 0:
            log.warning("token gap: expected %d, got %d", self.next_index, event.index)
            skip = 0
        fresh = event.tokens[skip:] if skip else event.tokens
        self.next_index = max(self.next_index, event.index + len(event.tokens))
        return fresh


#: Entries of one stream in order, as :func:`follow` yields them.
Batch = list[tuple[str, Event]]


async def follow(
    state: AppState, request_id: str, last_id: str = "0-0"
) -> AsyncIterator[Batch | None]:
    """Events of the request after ``last_id``, in batches of those that arrived
    together (never empty); ``None`` marks an idle keep-alive tick."""
    if last_id != "0-0" and await _ended_by(state, request_id, last_id):
        return
    keepalive = state.settings.sse_keepalive_seconds
    async with state.relay.subscription(keys.stream(request_id), last_id) as sub:
        state.following.add(sub)  # so that a shutdown can end it cleanly
        try:
            while True:
                batch = await sub.batch(keepalive)
                if not batch:
                    if not await state.redis.exists(keys.request(request_id)):
                        yield [
                            (
                                sub.last_id,
                                ErrorEvent(
                                    code="expired",
                                    message="the request expired before it finished",
                                ),
                            )
                        ]
                        return
                    yield IDLE
                    continue
                for i, (_, event) in enumerate(batch):
                    if type(event) is not TokensEvent and is_terminal(event):
                        yield batch[: i + 1]
                        return
                yield batch
        finally:
            state.following.discard(sub)


async def _ended_by(state: AppState, request_id: str, last_id: str) -> bool:
    """Whether ``last_id`` is at or past the request's final event: nothing will
    follow, so a subscription would only send keep-alives."""
    final = await final_event_id(state.redis, request_id)
    return final is not None and parse_id(final) <= parse_id(last_id)


#: The code of the error event that ends a stream the API process stops relaying.
SHUTTING_DOWN = "shutting_down"


def end_open_streams(state: AppState) -> int:
    """End every stream still relayed with an error event (the API process stops):
    an OpenAI client gets an error chunk and ``[DONE]`` instead of a cut connection;
    a native client's event carries the last id, so it resumes elsewhere from there."""
    ended = 0
    for sub in list(state.following):
        event = ErrorEvent(
            code=SHUTTING_DOWN,
            message="the API process is shutting down; retry the request (native clients: "
            "reconnect with Last-Event-ID)",
        )
        sub.end(event)
        ended += 1
    return ended
