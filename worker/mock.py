"""The mock model: realistic timing, deterministic output, no GPU.

It implements the declaration in :mod:`llmq.model.interface` (see there for the
contract every backend keeps); this module holds only the mock and its step loop.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
import math
import random
import weakref
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

from llmq.model.interface import (
    CAPABILITIES,
    Emit,
    GenerationRequest,
    Report,
    Token,
    ToolCallStart,
)
from llmq.model.tokenizer import count_tokens
from worker import structured

WORDS = (
    "The quick brown fox jumps over the lazy dog . This is a test . "
    "A model streams one token at a time , and the queue keeps the order ."
).split()

#: The texts the mock draws from: a word after a space.
TEXTS = tuple(" " + word for word in WORDS)


class _Steps:
    """The mock engine's step loop on one event loop: one timer for all sequences.

    Sequences wait in a heap by their next deadline. After its first token (one
    interval after prefill, exactly), a sequence's deadlines lie on a grid of
    ``grid`` seconds (a fraction of the interval: the gap after the first token is
    stretched by less than one step) and advance by one interval per token. So the
    sequences of a worker fall due together, a few steps per interval, and each step
    wakes the loop once and emits one token for every sequence due, instead of one
    timer and one task wake-up per token per sequence. After a late step the next
    one follows at once until the backlog is out, so lateness does not accumulate.
    """

    def __init__(self, interval: float, grid: float) -> None:
        self._interval = interval
        self._grid = grid
        self._heap: list[tuple[float, int, _Sequence]] = []
        self._order = itertools.count()
        self._timer: asyncio.Handle | None = None
        self._timer_at = 0.0

    def add(self, outputs: Iterator[str], emit: Emit) -> asyncio.Future[None]:
        """Run ``outputs``, the first token one interval from now; the future is done
        when they end (cancel it to stop them)."""
        loop = asyncio.get_running_loop()
        sequence = _Sequence(outputs, emit, loop.create_future())
        if sequence.advance():
            heapq.heappush(self._heap, (loop.time() + self._interval, next(self._order), sequence))
            self._schedule(loop)
        return sequence.finished

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        """One timer, at the earliest deadline."""
        if not self._heap:
            return
        when = self._heap[0][0]
        if self._timer is not None:
            if self._timer_at <= when:
                return
            self._timer.cancel()
        self._timer, self._timer_at = loop.call_at(when, self._step, loop), when

    def _step(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        heap, interval, grid = self._heap, self._interval, self._grid
        now = loop.time() + _TIMER_RESOLUTION
        stepped = []
        while heap and heap[0][0] <= now:
            due, order, sequence = heapq.heappop(heap)
            if not sequence.step():
                continue
            if sequence.first:  # the following tokens go on the grid
                sequence.first = False
                due = math.ceil((due + interval) / grid - 1e-6) * grid - interval
            stepped.append((due + interval, order, sequence))
        # One token per sequence per step: a late step's backlog goes out over the
        # next loop iterations, each token with its own flush, as if on time.
        for entry in stepped:
            heapq.heappush(heap, entry)
        self._schedule(loop)


#: Event loop timers fire up to about a millisecond early or late (uvloop counts in
#: milliseconds): a step takes what falls due within it.
_TIMER_RESOLUTION = 0.001


class _Sequence:
    """One running sequence: its next output, already drawn, and where outputs go."""

    __slots__ = ("emit", "finished", "first", "next", "outputs")

    def __init__(self, outputs: Iterator[str], emit: Emit, finished: asyncio.Future[None]):
        self.outputs, self.emit, self.finished = outputs, emit, finished
        self.next: str | None = None
        #: Before the first token, which alone is off the grid.
        self.first = True

    def advance(self) -> bool:
        """Draw the next output; False (and finished) when there is none. Outputs that
        take no time (a tool call's start) are emitted at once."""
        try:
            for out in self.outputs:
                if isinstance(out, ToolCallStart | Report):
                    if not self._emit(out):
                        return False
                    continue
                self.next = out
                return True
        except Exception as exc:
            return self._end(exc)
        return self._end(None)

    def step(self) -> bool:
        """Emit the token due now and draw the next; False once the sequence is over
        (cancelled, ended, or its consumer raised)."""
        if self.finished.done() or self.next is None:
            return False
        out, self.next = self.next, None
        try:  # _emit, inline: this runs once per token of every sequence
            self.emit(out)
        except Exception as exc:
            return self._end(exc)
        return not self.finished.done() and self.advance()

    def _emit(self, out: str) -> bool:
        try:
            self.emit(out)
        except Exception as exc:
            return self._end(exc)
        return not self.finished.done()

    def _end(self, exc: Exception | None) -> bool:
        if not self.finished.done():
            if exc is None:
                self.finished.set_result(None)
            else:
                self.finished.set_exception(exc)
        return False


@dataclass(frozen=True)
class MockModel:
    """A model with realistic timing and deterministic output.

    Prefill sleeps ``prefill_seconds_per_token`` per prompt token, then one token
    is produced every ``1 / tokens_per_second`` seconds, the first one interval
    after prefill. Like a continuous-batching engine, all sequences on an event loop
    share one step loop (:class:`_Steps`): after its first token, a sequence's
    tokens fall due on a grid of ``steps_per_token`` steps per interval (so the gap
    after the first token is up to one step longer; the others are exactly one
    interval). Deadlines are absolute, so a busy event loop does not stretch the
    inter-token time cumulatively. Each next token is drawn when the previous one is
    emitted, so a sequence that stops by itself ends right after its last token. The
    same seed always yields the same tokens.

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
    steps_per_token: int = 2
    _steps: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Steps] = field(
        default_factory=weakref.WeakKeyDictionary, init=False, repr=False, compare=False
    )

    def count_tokens(self, text: str) -> int:
        return count_tokens(text)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[str]:
        ready: collections.deque[str] = collections.deque()
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()

        def wake(*_: object) -> None:
            if not waiter.done():
                waiter.set_result(None)

        def emit(out: str) -> None:
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
        """Prefill, then join the step loop; the future is done when the sequence ends."""
        context = request.prompt_tokens + len(request.generated)
        await asyncio.sleep(context * self.prefill_seconds_per_token)
        loop = asyncio.get_running_loop()
        steps = self._steps.get(loop)
        if steps is None:
            interval = 1.0 / self.tokens_per_second
            steps = self._steps[loop] = _Steps(interval, interval / self.steps_per_token)
        return steps.add(self._outputs(request), emit)

    def _outputs(self, request: GenerationRequest) -> Iterator[str]:
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
