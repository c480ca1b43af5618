"""The model interface and the default mock.

A backend implements :class:`Model`: count a prompt's tokens, and turn a
:class:`GenerationRequest` into an async iterator of token texts. The iterator
ending before ``max_tokens`` means the model stopped by itself (finish_reason
``stop``); reaching ``max_tokens`` means ``length``. Everything around it
(queueing, streaming, cancellation) is the pipeline's job, not the model's.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

WORDS = (
    "The quick brown fox jumps over the lazy dog . This is a test . "
    "A model streams one token at a time , and the queue keeps the order ."
).split()


def count_tokens(text: str) -> int:
    """Whitespace tokens: the mock's tokenizer, also used by the API to size prompts."""
    return len(text.split())


def seed_for(request_id: str, seed: int | None) -> int:
    """The request's own seed, else one derived from its id, so a re-run repeats itself."""
    if seed is not None:
        return seed
    return int.from_bytes(hashlib.blake2b(request_id.encode(), digest_size=8).digest(), "big")


@dataclass(frozen=True)
class GenerationRequest:
    """What a model needs to generate: the prompt and the sampling parameters."""

    prompt: str
    max_tokens: int
    seed: int
    prompt_tokens: int
    stop: tuple[str, ...] = field(default=())
    temperature: float = 1.0


class Model(Protocol):
    """A generator of tokens. Implementations must be safe to call concurrently."""

    def count_tokens(self, text: str) -> int: ...

    def generate(self, request: GenerationRequest) -> AsyncIterator[str]: ...


@dataclass(frozen=True)
class MockModel:
    """A model with realistic timing and deterministic output.

    Prefill sleeps ``prefill_seconds_per_token`` per prompt token, then one token
    is produced every ``1 / tokens_per_second`` seconds. Tokens are scheduled on
    absolute deadlines, so a busy event loop does not stretch the inter-token time
    cumulatively. The same seed always yields the same tokens.
    """

    tokens_per_second: float = 50.0
    prefill_seconds_per_token: float = 0.0001
    stop_probability: float = 0.0

    def count_tokens(self, text: str) -> int:
        return count_tokens(text)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(request.prompt_tokens * self.prefill_seconds_per_token)
        rng = random.Random(request.seed)
        interval = 1.0 / self.tokens_per_second
        start = loop.time()
        for i in range(request.max_tokens):
            delay = start + (i + 1) * interval - loop.time()
            await asyncio.sleep(max(delay, 0.0))
            token = " " + rng.choice(WORDS)
            if any(s in token for s in request.stop):
                return
            yield token
            if self.stop_probability and rng.random() < self.stop_probability:
                return
