"""The model interface and the default mock.

A backend implements :class:`Model`: count a prompt's tokens, and turn a
:class:`GenerationRequest` into an async iterator of token texts. The iterator
ending before ``max_tokens`` means the model stopped by itself (finish_reason
``stop``); reaching ``max_tokens`` means ``length``. Everything around it
(queueing, streaming, cancellation) is the pipeline's job, not the model's.

A re-run (after a worker died, or the model raised) passes the tokens the request
already published as :attr:`GenerationRequest.generated`: the backend continues
after them, as a server resuming a sequence would (prefill prompt + generated,
then decode the rest), instead of generating them again.
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
    """What a model needs to generate: the prompt and the sampling parameters.

    ``generated`` holds the tokens this request already produced (and its readers
    already have), in order; empty on a first run. ``max_tokens`` counts them too:
    a model resuming after ``len(generated)`` tokens yields at most
    ``max_tokens - len(generated)`` more.
    """

    prompt: str
    max_tokens: int
    seed: int
    prompt_tokens: int
    stop: tuple[str, ...] = field(default=())
    temperature: float = 1.0
    generated: tuple[str, ...] = field(default=())


class Model(Protocol):
    """A generator of tokens. Implementations must be safe to call concurrently.

    ``generate`` yields the tokens that follow ``request.generated``, not those
    tokens again: a real backend prefills ``prompt + generated`` (the KV cache of
    the interrupted run is gone) and decodes from there, and it stops by itself
    (or at ``max_tokens``, which counts the ``generated`` tokens) exactly as the
    uninterrupted run would have. A deterministic backend should make the resumed
    output equal to the rest of an uninterrupted run with the same seed.
    """

    def count_tokens(self, text: str) -> int: ...

    def generate(self, request: GenerationRequest) -> AsyncIterator[str]: ...


@dataclass(frozen=True)
class MockModel:
    """A model with realistic timing and deterministic output.

    Prefill sleeps ``prefill_seconds_per_token`` per prompt token, then one token
    is produced every ``1 / tokens_per_second`` seconds. Tokens are scheduled on
    absolute deadlines, so a busy event loop does not stretch the inter-token time
    cumulatively. The same seed always yields the same tokens.

    A resumed request (``generated`` not empty) prefills ``prompt_tokens +
    len(generated)`` tokens, replays the random draws of the tokens already
    generated without waiting (the same choices, stop-sequence checks and
    ``stop_probability`` draws), then decodes the rest on the normal schedule: the
    tokens that follow are the ones the uninterrupted run would have produced.
    """

    tokens_per_second: float = 50.0
    prefill_seconds_per_token: float = 0.0001
    stop_probability: float = 0.0

    def count_tokens(self, text: str) -> int:
        return count_tokens(text)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        context = request.prompt_tokens + len(request.generated)
        await asyncio.sleep(context * self.prefill_seconds_per_token)
        rng = random.Random(request.seed)
        resume = min(len(request.generated), request.max_tokens)
        for _ in range(resume):
            # The draws of the run that produced these tokens, without its waits.
            if self._draw(rng, request) is None or self._stops_after(rng):
                return  # that run had stopped here already: nothing follows
        interval = 1.0 / self.tokens_per_second
        start = loop.time()
        for i in range(request.max_tokens - resume):
            delay = start + (i + 1) * interval - loop.time()
            await asyncio.sleep(max(delay, 0.0))
            token = self._draw(rng, request)
            if token is None:
                return
            yield token
            if self._stops_after(rng):
                return

    @staticmethod
    def _draw(rng: random.Random, request: GenerationRequest) -> str | None:
        """The next token, or None if it contains a stop sequence (the model stops)."""
        token = " " + rng.choice(WORDS)
        return None if any(s in token for s in request.stop) else token

    def _stops_after(self, rng: random.Random) -> bool:
        """Whether the model stops after a token (no draw at all without a probability)."""
        return bool(self.stop_probability) and rng.random() < self.stop_probability
