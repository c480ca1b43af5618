"""The mock model: realistic timing, deterministic output, no GPU.

It implements the declaration in :mod:`llmq.model.interface` (see there for the
contract every backend keeps); this module holds the mock's outputs, and its timing
comes from the engine model in :mod:`worker.mock_engine` (steps, KV cache, scheduler).
"""

from __future__ import annotations

import asyncio
import collections
import random
import weakref
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from llmq.model.blocks import block_hashes
from llmq.model.interface import (
    CAPABILITIES,
    CacheListener,
    Emit,
    GenerationRequest,
    Output,
    Token,
    ToolCallStart,
)
from llmq.model.tokenizer import WHITESPACE, count_tokens
from worker import structured
from worker.mock_engine.kv_cache import KVCache
from worker.mock_engine.loop import EngineLoop, Running, StepCosts
from worker.mock_engine.profiles import DEFAULT, EngineProfile
from worker.mock_engine.scheduler import EngineSequence, Scheduler

WORDS = (
    "The quick brown fox jumps over the lazy dog . This is a test . "
    "A model streams one token at a time , and the queue keeps the order ."
).split()

#: The texts the mock draws from: a word after a space.
TEXTS = tuple(" " + word for word in WORDS)


@dataclass(frozen=True)
class MockBackend:
    """A model with realistic timing and deterministic output.

    Timing is that of a small continuous-batching engine (:mod:`worker.mock_engine`): all
    sequences on an event loop share its steps; a step computes one token for each
    decoding sequence and chunks of the prompts being prefilled (at most
    ``step_token_budget`` tokens), and takes ``1 / tokens_per_second`` plus
    ``prefill_seconds_per_token`` per prompt token and ``decode_seconds_per_token``
    per decode token it computes. So a sequence alone gets its first token one
    interval after its prefill and then one per interval, and a long prefill slows
    every sequence that shares its steps, as on a GPU. The KV cache holds
    ``kv_blocks`` blocks of ``block_size`` tokens: a prompt whose leading blocks are
    cached prefills only the rest (its ``Report`` says how many prompt tokens were
    cached, before its first token); when running sequences need more blocks than
    are left, the newest is preempted and recomputed later. The default figures keep
    the historical 50 tokens/s per sequence, whatever the batch, and a cheap prefill;
    :meth:`from_profile` takes a named profile's (:mod:`worker.mock_engine.profiles`).

    Each next token is drawn when the previous one is emitted, so a sequence that
    stops by itself ends right after its last token. The same seed always yields
    the same tokens.

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
    prefill_seconds_per_token: float = DEFAULT.prefill_token_seconds
    stop_probability: float = 0.0
    capabilities: frozenset[str] = CAPABILITIES
    #: Its KV cache always keeps the blocks it computed, named, for the prompts that
    #: start with them (:mod:`worker.mock_engine.kv_cache`): a prefix cache, as vLLM's.
    prefix_cache: ClassVar[bool] = True
    decode_seconds_per_token: float = DEFAULT.decode_token_seconds
    kv_blocks: int = DEFAULT.kv_blocks
    block_size: int = DEFAULT.block_size
    step_token_budget: int = DEFAULT.step_token_budget
    _engines: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, EngineLoop] = field(
        default_factory=weakref.WeakKeyDictionary, init=False, repr=False, compare=False
    )
    _listeners: list[CacheListener] = field(
        default_factory=list, init=False, repr=False, compare=False
    )

    @classmethod
    def from_profile(cls, profile: EngineProfile, **overrides: Any) -> MockBackend:
        """A mock with ``profile``'s figures, any of them replaced by ``overrides``."""
        figures: dict[str, Any] = {
            "tokens_per_second": 1 / profile.step_seconds,
            "prefill_seconds_per_token": profile.prefill_token_seconds,
            "decode_seconds_per_token": profile.decode_token_seconds,
            "kv_blocks": profile.kv_blocks,
            "block_size": profile.block_size,
            "step_token_budget": profile.step_token_budget,
        }
        return cls(**(figures | overrides))

    def count_tokens(self, text: str) -> int:
        return count_tokens(text)

    def watch_cache(self, listener: CacheListener) -> None:
        """``listener`` hears, after each step, the prompt blocks that became cached and
        those evicted (:class:`~llmq.model.interface.CacheReporting`)."""
        self._listeners.append(listener)

    def kv_usage(self) -> float:
        """The fraction of the KV cache that running sequences hold, on this event loop."""
        engine = self._engines.get(asyncio.get_running_loop())
        return engine.cache.usage if engine is not None else 0.0

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Output]:
        ready: collections.deque[Output] = collections.deque()
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()

        def wake(*_: object) -> None:
            if not waiter.done():
                waiter.set_result(None)

        def emit(out: Output) -> None:
            ready.append(out)
            wake()

        finished = await self._start(request, emit)
        finished.add_done_callback(wake)
        try:
            while True:
                while ready:
                    yield ready.popleft()
                if finished.done():
                    finished.result()
                    return
                await waiter
                waiter = loop.create_future()
        finally:
            finished.cancel()

    async def generate_into(self, request: GenerationRequest, emit: Emit) -> None:
        finished = await self._start(request, emit)
        try:
            await finished
        finally:
            finished.cancel()

    async def _start(self, request: GenerationRequest, emit: Emit) -> asyncio.Future[None]:
        """Queue the sequence on the engine; the future is done when it ends."""
        loop = asyncio.get_running_loop()
        engine = self._engines.get(loop)
        if engine is None:
            cache = KVCache(self.kv_blocks, self.block_size)
            costs = StepCosts(
                1.0 / self.tokens_per_second,
                self.prefill_seconds_per_token,
                self.decode_seconds_per_token,
            )
            scheduler = Scheduler(cache, self.step_token_budget)
            engine = self._engines[loop] = EngineLoop(scheduler, costs, self._listeners, loop)
        full = request.prompt_tokens // self.block_size
        names = block_hashes(WHITESPACE.tokens(request.prompt), self.block_size, limit=full)
        # At least one token to compute, as a real prompt has its start token.
        context = max(1, request.prompt_tokens + len(request.generated))
        state = EngineSequence(names, prompt_tokens=request.prompt_tokens, tokens=context)
        finished = loop.create_future()
        engine.add(Running(self._outputs(request), emit, finished, state))
        return finished

    def _outputs(self, request: GenerationRequest) -> Iterator[Output]:
        """Everything the request produces after ``generated``, in order, untimed."""
        planned = self._plan(request)
        if planned is not None:
            call, pieces = planned
            if call is not None and not request.generated:
                yield call
            texts = self._pieces(pieces, request)
        else:
            texts = self._sampled(request)
        if request.logprobs is None:
            yield from texts  # no generator of its own per token: nearly every request
            return
        position = min(len(request.generated), request.max_tokens)
        for text in texts:
            yield Token(text, structured.logprob_of(request.seed, position, text, request.logprobs))
            position += 1

    def _plan(self, request: GenerationRequest) -> tuple[ToolCallStart | None, list[str]] | None:
        """The whole output of a tool call or JSON answer (None: sampled text)."""
        rng = random.Random(f"plan:{request.seed}")
        tools = request.tools if request.tool_choice != "none" else ()
        # "auto": the seed decides, except that a tool's result is answered in text
        # (so that an agent's loop ends).
        if tools and (
            request.tool_choice == "required"
            or (not request.after_tool_result and rng.random() < 0.5)
        ):
            tool = tools[rng.randrange(len(tools))]
            schema = tool.get("parameters") or {"type": "object", "properties": {}}
            call = ToolCallStart(f"call_{rng.getrandbits(64):016x}", str(tool["name"]))
            text = structured.object_text(schema, rng, request.max_tokens)
            return call, structured.pieces(text)
        if request.response_format is not None:
            schema = request.response_format.get("schema")
            if request.response_format.get("type") == "json_object":
                schema = structured.schema_in_prompt(request.prompt)
            text = structured.object_text(schema, rng, request.max_tokens)
            return None, structured.pieces(text)
        return None

    @staticmethod
    def _pieces(pieces: list[str], request: GenerationRequest) -> Iterator[str]:
        for piece in pieces[len(request.generated) : request.max_tokens]:
            if any(s in piece for s in request.stop):
                return  # a stop sequence ends structured output too (truncated: "stop")
            yield piece

    def _sampled(self, request: GenerationRequest) -> Iterator[str]:
        rng = random.Random(request.seed)
        resume = min(len(request.generated), request.max_tokens)
        for position in range(resume):
            # The draws of the run that produced these tokens.
            if self._draw(rng, request) is None or self._stops_after(rng, request, position):
                return  # that run had stopped here already: nothing follows
        if not request.stop and not self.stop_probability:
            # Nearly every request: the same draws, without two checks' calls per token.
            choice = rng.choice
            for _ in range(resume, request.max_tokens):
                yield choice(TEXTS)
            return
        for position in range(resume, request.max_tokens):
            token = self._draw(rng, request)
            if token is None:
                return
            yield token
            if self._stops_after(rng, request, position):
                return

    @staticmethod
    def _draw(rng: random.Random, request: GenerationRequest) -> str | None:
        """The next token, or None if it contains a stop sequence (the model stops)."""
        token = rng.choice(TEXTS)
        return None if any(s in token for s in request.stop) else token

    def _stops_after(self, rng: random.Random, request: GenerationRequest, position: int) -> bool:
        """Whether the model stops after the token at ``position`` (no draw at all
        without a probability; ``ignore_eos`` and ``min_tokens`` only veto the stop,
        so the draws, and with them the tokens, stay those of the plain run)."""
        if not self.stop_probability or rng.random() >= self.stop_probability:
            return False
        return not request.ignore_eos and position + 1 >= request.min_tokens
