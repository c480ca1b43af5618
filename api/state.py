"""The resources of one API process, created and closed by the app's lifespan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from redis.asyncio import Redis
from redis.commands.core import AsyncScript

from api.catalog import Catalog
from api.relay import StreamRelay
from llmq.settings import ApiSettings


@dataclass(frozen=True)
class AppState:
    settings: ApiSettings
    process_id: str
    redis: Redis
    relay: StreamRelay
    catalog: Catalog
    enqueue: AsyncScript


def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.llmq
    return state


#: The process's state as a FastAPI dependency.
State = Annotated[AppState, Depends(get_state)]
