"""The model interface and the default mock.

A backend implements :class:`Model`: count a prompt's tokens, and turn a
:class:`GenerationRequest` into an async iterator of token texts (a
:class:`Token` carries a log-probability; a :class:`ToolCallStart` comes before
the arguments of a tool call). The iterator ending before ``max_tokens`` means the
model stopped by itself (finish_reason ``stop``); reaching ``max_tokens`` means
``length``. Everything around it (queueing, streaming, cancellation) is the
pipeline's job, not the model's.

A backend declares what it honours beyond plain text in a ``capabilities``
attribute (names from :data:`CAPABILITIES`); the API refuses requests that need
more than the serving workers declare, so nothing is silently ignored.

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
from typing import Any, Literal, Protocol

from llmq.schema import TokenLogprob
from worker import structured

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


#: What a backend may declare it honours: log-probabilities, JSON mode, JSON
#: schemas, tool calls, and the ``ignore_eos``/``min_tokens`` length controls.
CAPABILITIES = frozenset(
    {"logprobs", "json_object", "json_schema", "tools", "ignore_eos", "min_tokens"}
)


def capabilities_of(model: object) -> tuple[str, ...]:
    """What ``model`` declares it honours (nothing if it declares nothing)."""
    declared: frozenset[str] = getattr(model, "capabilities", frozenset())
    return tuple(sorted(c for c in declared if c in CAPABILITIES))


class Token(str):
    """A generated token that carries its log-probability (when the request asked).

    A ``str``, so that a consumer of plain token texts reads it unchanged.
    """

    logprob: TokenLogprob | None

    def __new__(cls, text: str, logprob: TokenLogprob | None = None) -> Token:
        token = super().__new__(cls, text)
        token.logprob = logprob
        return token


class ToolCallStart(str):
    """The model calls a tool: the tokens that follow are its JSON arguments.

    An empty ``str`` (it adds no text), yielded once before the arguments.
    """

    id: str
    name: str

    def __new__(cls, call_id: str, name: str) -> ToolCallStart:
        start = super().__new__(cls, "")
        start.id, start.name = call_id, name
        return start


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
    #: Never stop by itself (stop sequences still apply), as vLLM's ``ignore_eos``.
    ignore_eos: bool = False
    #: Do not stop by itself before this many tokens (stop sequences still apply).
    min_tokens: int = 0
    #: Log-probabilities with this many alternatives per token; None: none.
    logprobs: int | None = None
    #: ``{"type": "json_object"}`` or ``{"type": "json_schema", "schema": ...}``.
    response_format: dict[str, Any] | None = None
    #: Function tools (``{"name", "parameters"}``) and whether to call one.
    tools: tuple[dict[str, Any], ...] = field(default=())
    tool_choice: Literal["auto", "required", "none"] = "auto"


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

    Structured output is planned whole from the seed, then streamed piece by
    piece: a JSON document valid for the requested schema, or a tool call (with
    ``tool_choice`` "auto" the seed decides whether to call one) whose arguments
    are valid for the tool's parameters. Log-probabilities are synthetic, derived
    from the seed and the position.
    """

    tokens_per_second: float = 50.0
    prefill_seconds_per_token: float = 0.0001
    stop_probability: float = 0.0
    capabilities: frozenset[str] = CAPABILITIES

    def count_tokens(self, text: str) -> int:
        return count_tokens(text)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        context = request.prompt_tokens + len(request.generated)
        await asyncio.sleep(context * self.prefill_seconds_per_token)
        planned = self._plan(request)
        if planned is not None:
            call, pieces = planned
            texts: AsyncIterator[str] = self._paced(pieces, request, loop)
            if call is not None and not request.generated:
                yield call
        else:
            texts = self._sampled(request, loop)
        position = min(len(request.generated), request.max_tokens)
        async for text in texts:
            if request.logprobs is None:
                yield text
            else:
                yield Token(
                    text, structured.logprob_of(request.seed, position, text, request.logprobs)
                )
            position += 1

    def _plan(self, request: GenerationRequest) -> tuple[ToolCallStart | None, list[str]] | None:
        """The whole output of a tool call or JSON answer (None: sampled text)."""
        rng = random.Random(f"plan:{request.seed}")
        tools = request.tools if request.tool_choice != "none" else ()
        if tools and (request.tool_choice == "required" or rng.random() < 0.5):
            tool = tools[rng.randrange(len(tools))]
            schema = tool.get("parameters") or {"type": "object", "properties": {}}
            call = ToolCallStart(f"call_{rng.getrandbits(64):016x}", str(tool["name"]))
            return call, structured.pieces(structured.object_text(schema, rng))
        if request.response_format is not None:
            text = structured.object_text(request.response_format.get("schema"), rng)
            return None, structured.pieces(text)
        return None

    async def _paced(
        self, pieces: list[str], request: GenerationRequest, loop: asyncio.AbstractEventLoop
    ) -> AsyncIterator[str]:
        interval = 1.0 / self.tokens_per_second
        start = loop.time()
        rest = pieces[len(request.generated) : request.max_tokens]
        for i, piece in enumerate(rest):
            await asyncio.sleep(max(start + (i + 1) * interval - loop.time(), 0.0))
            if any(s in piece for s in request.stop):
                return  # a stop sequence ends structured output too (truncated: "stop")
            yield piece

    async def _sampled(
        self, request: GenerationRequest, loop: asyncio.AbstractEventLoop
    ) -> AsyncIterator[str]:
        rng = random.Random(request.seed)
        resume = min(len(request.generated), request.max_tokens)
        for position in range(resume):
            # The draws of the run that produced these tokens, without its waits.
            if self._draw(rng, request) is None or self._stops_after(rng, request, position):
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
            if self._stops_after(rng, request, resume + i):
                return

    @staticmethod
    def _draw(rng: random.Random, request: GenerationRequest) -> str | None:
        """The next token, or None if it contains a stop sequence (the model stops)."""
        token = " " + rng.choice(WORDS)
        return None if any(s in token for s in request.stop) else token

    def _stops_after(self, rng: random.Random, request: GenerationRequest, position: int) -> bool:
        """Whether the model stops after the token at ``position`` (no draw at all
        without a probability; ``ignore_eos`` and ``min_tokens`` only veto the stop,
        so the draws, and with them the tokens, stay those of the plain run)."""
        if not self.stop_probability or rng.random() >= self.stop_probability:
            return False
        return not request.ignore_eos and position + 1 >= request.min_tokens
