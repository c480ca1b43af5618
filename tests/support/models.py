"""Models for the worker that behave as a failing backend would."""

from __future__ import annotations

from collections.abc import AsyncIterator

from llmq.model.interface import GenerationRequest, Output
from llmq.model.tokenizer import count_tokens
from worker.mock import MockBackend


class Flaky:
    """Fails at token index 3 when the prompt says so: a backend outside llmq.

    The position is the request's, not the run's: a re-run resumes after the
    tokens already published (``request.generated``), and a poison request fails
    at the same place every time.
    """

    def __init__(self) -> None:
        self.inner = MockBackend(tokens_per_second=500)
        self.seen: set[int] = set()

    def count_tokens(self, text: str) -> int:
        return count_tokens(text)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Output]:
        n = len(request.generated)
        first_run = request.seed not in self.seen
        self.seen.add(request.seed)
        async for token in self.inner.generate(request):
            if n == 3 and (
                "explode" in request.prompt or ("hiccup" in request.prompt and first_run)
            ):
                raise RuntimeError("device lost")
            n += 1
            yield token
