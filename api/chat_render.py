"""A chat request's prompt as its engine renders it, for routing's block names.

Under a routed policy the API names a prompt's leading KV blocks at admission
(:meth:`llmq.protocol.routing.Routing.hint`). A worker sends chat requests to its
engine's chat API, which applies the model's own template, so names taken from
llmq's plain ``role: content`` rendering would name blocks no engine computes. Where
a live worker of the model registered how its engine renders messages
(``upstream.render``: llama.cpp's ``POST /apply-template`` answers the ``prompt``
text, cut then by the routing's tokenizer; vLLM's ``POST /tokenize`` with
``messages`` answers the ``tokens``' ids, named as they are), the API asks it and
names that rendering. The call is bounded (:data:`TIMEOUT_SECONDS`) and any failure
falls back to the plain rendering, logged once until the endpoint answers again;
answers are kept in a bounded LRU cache by the digest of the endpoint and messages.
Once the API process closes it (:meth:`ChatRendering.aclose`, at shutdown), it asks
no engine again: a request admitted while the process stops gets the plain names
rather than a client (and a connection) that nobody would close.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import httpx

from llmq.model.tokenizer import Tokenizer

log = logging.getLogger(__name__)

#: How long admission waits for an engine's rendering before it names the plain one.
TIMEOUT_SECONDS = 0.5
#: Renderings kept (by the digest of the endpoint and the messages).
CACHE_SIZE = 1024


class ChatRendering:
    """The tokens of the engine's rendering of chat messages, None where not had."""

    def __init__(self, timeout: float = TIMEOUT_SECONDS, size: int = CACHE_SIZE) -> None:
        self._timeout = timeout
        self._size = size
        self._client: httpx.AsyncClient | None = None
        self._closed = False
        self._cache: OrderedDict[bytes, tuple[str, ...]] = OrderedDict()
        self._failing: set[str] = set()

    async def render(
        self,
        renderer: dict[str, Any] | None,
        messages: Sequence[dict[str, Any]],
        tokenizer: Tokenizer,
    ) -> tuple[str, ...] | None:
        """``messages`` rendered by ``renderer`` (a registry ``upstream.render``), as the
        tokens routing names blocks of; None: no renderer, or it failed."""
        if renderer is None:
            return None
        url = str(renderer["url"])
        body = {**(renderer.get("fields") or {}), "messages": list(messages)}
        key = hashlib.blake2b(
            json.dumps([url, tokenizer.name, body], sort_keys=True).encode(), digest_size=16
        ).digest()
        if (cached := self._cache.get(key)) is not None:
            self._cache.move_to_end(key)
            return cached
        if self._closed:
            return None
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self._timeout)
        try:
            answer = await self._client.post(url, json=body)
            answer.raise_for_status()
            tokens = _tokens(answer.json(), renderer.get("answer"), tokenizer)
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            if url not in self._failing:
                self._failing.add(url)
                log.warning("chat rendering by %s failed (%r): routing names the plain", url, exc)
            return None
        self._failing.discard(url)
        self._cache[key] = tokens
        if len(self._cache) > self._size:
            self._cache.popitem(last=False)
        return tokens

    async def aclose(self) -> None:
        """Close the client and its connections, for good: a later :meth:`render`
        names the plain rendering instead of opening another client."""
        self._closed = True
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def _tokens(answer: Any, kind: Any, tokenizer: Tokenizer) -> tuple[str, ...]:
    """The tokens of an engine's answer: its ``prompt`` text cut by ``tokenizer``, or
    its ``tokens`` ids as they are."""
    if kind == "prompt" and isinstance(answer["prompt"], str):
        return tuple(tokenizer.tokens(answer["prompt"]))
    if kind == "tokens" and isinstance(answer["tokens"], list):
        return tuple(str(int(t)) for t in answer["tokens"])
    raise TypeError(f"no {kind} in the engine's answer")
