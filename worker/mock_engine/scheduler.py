"""The engine's scheduling decisions: what each step computes, as vLLM's scheduler.

Continuous batching: every step computes, within a budget of ``token_budget``
tokens, one token for each running sequence that is decoding, then chunks of the
prompts still being prefilled (those already running first, then new ones, in
arrival order). A sequence whose tokens are all computed at the end of a step
samples its next token. A new sequence first takes its prompt's cached prefix
(whole blocks, matched from the start; at least its last token is always
computed, as vLLM does) and prefills only the rest.

Blocks come from the :class:`~worker.mock_engine.kv_cache.KVCache`. When a running
sequence needs a block and none is left, the newest running sequence is preempted:
its blocks go back (its full prompt blocks stay cached) and it waits at the head of
the queue to be recomputed (prompt and the tokens it produced), as vLLM's
recompute preemption. No new sequence is admitted in a step that preempted, unless
nothing is left running.

Pure decisions and bookkeeping, no clock: :mod:`worker.mock_engine.loop` times the
steps, so that everything here is testable without waiting.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from worker.mock_engine.kv_cache import KVCache


@dataclass(eq=False)
class EngineSequence:
    """One sequence as the scheduler sees it: token counts and the blocks it holds."""

    #: The names of its prompt's full blocks (:func:`llmq.model.blocks.block_hashes`).
    names: list[str]
    #: The prompt's length: the cached part of it is what ``cached_tokens`` reports.
    prompt_tokens: int
    #: Tokens so far: the prompt, the tokens a resumed request had, those produced since.
    tokens: int
    #: Tokens whose attention state is computed (cached ones included).
    computed: int = 0
    #: Blocks held; the first ``named`` of them are shared prompt blocks.
    blocks: int = 0
    named: int = 0
    #: Prompt tokens that came from the cache when first admitted (None: not yet).
    cached_tokens: int | None = None
    #: Past its prefill: its next step computes one token.
    decoding: bool = False
    preemptions: int = 0
    #: Among the running sequences (it holds blocks).
    running: bool = False
    #: Removed (ended or cancelled): a step under way ignores it.
    removed: bool = False


class DoesNotFit(Exception):
    """A sequence needs more blocks than the whole cache has."""


@dataclass
class Step:
    """What one step computes: tokens per sequence, and who was preempted for it."""

    work: dict[EngineSequence, int] = field(default_factory=dict)
    decode_tokens: int = 0
    prefill_tokens: int = 0
    preempted: list[EngineSequence] = field(default_factory=list)
    #: Sequences admitted for the first time: their ``cached_tokens`` is now known.
    admitted: list[EngineSequence] = field(default_factory=list)
    #: Sequences that can never fit the cache: the caller ends them with an error.
    failed: list[tuple[EngineSequence, DoesNotFit]] = field(default_factory=list)


class Scheduler:
    """Running and waiting sequences over one :class:`KVCache`."""

    def __init__(self, cache: KVCache, token_budget: int) -> None:
        if token_budget < 1:
            raise ValueError("the step token budget must be at least 1")
        self.cache, self.token_budget = cache, token_budget
        self.waiting: collections.deque[EngineSequence] = collections.deque()
        #: In admission order: the newest last, the first to be preempted.
        self.running: list[EngineSequence] = []

    def add(self, sequence: EngineSequence) -> None:
        self.waiting.append(sequence)

    def remove(self, sequence: EngineSequence) -> None:
        """An ended or cancelled sequence: its blocks go back (prompt blocks stay cached)."""
        if sequence.removed:
            return
        sequence.removed = True
        if sequence.running:
            self._stop_running(sequence)
        else:
            self.waiting.remove(sequence)

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting

    def schedule(self) -> Step:
        """The next step: decode tokens first, then prefill chunks, within the budget."""
        step = Step()
        budget = self.token_budget
        for decoding in (True, False):
            for sequence in list(self.running):
                if budget <= 0:
                    break
                if sequence.decoding is not decoding or not sequence.running:
                    continue
                count = min(sequence.tokens - sequence.computed, budget)
                if self._grow(sequence, count, step):
                    step.work[sequence] = count
                    budget -= count
                budget += self._unscheduled(step)
        if not step.preempted or not self.running:
            while self.waiting and budget > 0:
                sequence = self.waiting[0]
                needed = self._blocks_for(sequence.tokens + 1)
                if needed > self.cache.capacity:
                    self.waiting.popleft()
                    sequence.removed = True
                    problem = DoesNotFit(
                        f"the sequence needs {needed} KV blocks; "
                        f"the cache has {self.cache.capacity}"
                    )
                    step.failed.append((sequence, problem))
                    continue
                count = self._admit(sequence, budget)
                if not count:
                    break
                if sequence.cached_tokens is None:
                    hit = sequence.computed
                    sequence.cached_tokens = min(hit, sequence.prompt_tokens)
                    step.admitted.append(sequence)
                self.waiting.popleft()
                self.running.append(sequence)
                sequence.running = True
                step.work[sequence] = count
                budget -= count
        for sequence, count in step.work.items():
            if sequence.decoding:
                step.decode_tokens += count
            else:
                step.prefill_tokens += count
        return step

    def complete(self, step: Step) -> list[EngineSequence]:
        """The step's work is done: its full prompt blocks join the cache; the sequences
        whose tokens are all computed sampled one more (returned, in order)."""
        sampled = []
        size = self.cache.block_size
        for sequence, count in step.work.items():
            if sequence.removed:
                continue
            sequence.computed += count
            full = min(sequence.computed // size, len(sequence.names))
            while sequence.named < full:
                self.cache.name(sequence.names[sequence.named])
                sequence.named += 1
            if sequence.computed == sequence.tokens:
                sequence.tokens += 1
                sequence.decoding = True
                sampled.append(sequence)
        return sampled

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.cache.block_size)

    def _grow(self, sequence: EngineSequence, count: int, step: Step) -> bool:
        """Blocks for ``count`` more tokens of a running sequence, preempting the newest
        running sequences while none are left; False if it was itself preempted."""
        need = self._blocks_for(sequence.computed + count) - sequence.blocks
        while not self.cache.allocate(need):
            victim = self.running[-1]
            self._preempt(victim, step)
            if victim is sequence:
                return False
        sequence.blocks += need
        return True

    def _unscheduled(self, step: Step) -> int:
        """Budget back from preempted sequences that this step had already scheduled."""
        back = 0
        for victim in step.preempted:
            back += step.work.pop(victim, 0)
        return back

    def _preempt(self, sequence: EngineSequence, step: Step) -> None:
        self._stop_running(sequence)
        sequence.computed = 0
        sequence.decoding = False
        sequence.preemptions += 1
        self.waiting.appendleft(sequence)
        step.preempted.append(sequence)

    def _admit(self, sequence: EngineSequence, budget: int) -> int:
        """Tokens of ``sequence`` to compute in its first step (0: no blocks for it now).

        Takes its cached prefix first, so that freeing room for the rest cannot evict it.
        """
        size = self.cache.block_size
        names = sequence.names[: (sequence.tokens - 1) // size]
        hit = self.cache.match(names)
        self.cache.acquire(names[:hit])
        sequence.blocks = sequence.named = hit
        sequence.computed = hit * size
        count = min(sequence.tokens - sequence.computed, budget)
        need = self._blocks_for(sequence.computed + count) - sequence.blocks
        if not self.cache.allocate(need):
            self._release(sequence)
            sequence.computed = 0
            return 0
        sequence.blocks += need
        return count

    def _stop_running(self, sequence: EngineSequence) -> None:
        self.running.remove(sequence)
        sequence.running = False
        self._release(sequence)

    def _release(self, sequence: EngineSequence) -> None:
        names = sequence.names[: sequence.named]
        self.cache.release(names, sequence.blocks - sequence.named)
        sequence.blocks = sequence.named = 0
