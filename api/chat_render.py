"""A chat request's prompt as its engine renders it, for routing's block names.

Under a routed policy the API names a prompt's leading KV blocks at admission
(:meth:`llmq.protocol.routing.Routing.hint`). A worker sends chat requests to its
engine's chat API, which applies the model's own template, so names taken from
llmq's plain ``role: content`` rendering would name blocks no engine computes. Where
a live worker of the model registered its engine's render endpoint (llama.cpp's
``POST /apply-template``: ``{"messages"}`` in, ``{"prompt"}`` out), the API asks it
for the rendered prompt and names that. The call is bounded (:data:`TIMEOUT_SECONDS`)
and any failure falls back to the plain rendering, logged once until the endpoint
answers again; answers are kept in a bounded LRU cache by the messages' digest.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import httpx

log = logging.getLogger(__name__)

#: How long admission waits for an engine's rendering before it names the plain one.
TIMEOUT_SECONDS = 0.5
#: Renderings kept (by the digest of the endpoint and the messages).
CACHE_SIZE = 1024


class ChatRendering:
    """The engine's rendering of chat messages, or None where it could not be had."""

    def __init__(self, timeout: float = TIMEOUT_SECONDS, size: int = CACHE_SIZE) -> None:
        self._timeout = timeout
        self._size = size
        self._client: httpx.AsyncClient | None = None
        self._cache: OrderedDict[bytes, str] = OrderedDict()
        self._failing: set[str] = set()

    async def render(self, url: str | None, messages: Sequence[dict[str, Any]]) -> str | None:
        if url is None:
            return None
        body = {"messages": list(messages)}
        key = hashlib.blake2b(
            json.dumps([url, body], sort_keys=True).encode(), digest_size=16
        ).digest()
        if (cached := self._cache.get(key)) is not None:
            self._cache.move_to_end(key)
            return cached
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self._timeout)
        try:
            answer = await self._client.post(url, json=body)
            answer.raise_for_status()
            prompt = answer.json()["prompt"]
            if not isinstance(prompt, str):
                raise TypeError(f"prompt is {type(prompt).__name__}")
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            if url not in self._failing:
                self._failing.add(url)
                log.warning("chat rendering by %s failed (%r): routing names the plain", url, exc)
            return None
        self._failing.discard(url)
        self._cache[key] = prompt
        if len(self._cache) > self._size:
            self._cache.popitem(last=False)
        return prompt

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
