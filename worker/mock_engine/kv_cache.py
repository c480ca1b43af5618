"""The engine's KV cache: a fixed pool of blocks, with a prefix cache of named ones.

As in vLLM's block pool, every block holds the attention state of ``block_size``
tokens. A running sequence holds its blocks; a full block of a prompt, once
computed, gets the prompt's chained name for it (:func:`llmq.model.blocks.block_hashes`,
the names the API computes for routing) and can then be shared: another sequence
whose prompt starts with the same blocks takes them instead of prefilling them
again. A block no sequence holds keeps its name and contents (the prefix cache)
until the pool needs it for something else: such blocks are reused least recently
freed first (LRU). The other blocks (a prompt's partial last block, the generated
tokens') are private to their sequence and go back to the pool when it ends.

Pure bookkeeping, no timing: the scheduler (:mod:`worker.mock_engine.scheduler`) decides
when blocks are taken and given back. Which names became cached and which were
evicted accumulate until :meth:`KVCache.take_events`, so that a listener hears
them batched per step.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence


class KVCache:
    """``capacity`` blocks of ``block_size`` tokens; named blocks are shared by refcount."""

    def __init__(self, capacity: int, block_size: int) -> None:
        if capacity < 1 or block_size < 1:
            raise ValueError("a KV cache needs at least one block of at least one token")
        self.capacity, self.block_size = capacity, block_size
        #: Named blocks some sequence holds, with how many hold each.
        self._held: dict[str, int] = {}
        #: Named blocks no sequence holds, least recently freed first: the evictable cache.
        self._free_cached: collections.OrderedDict[str, None] = collections.OrderedDict()
        #: Private blocks in use.
        self._private = 0
        #: Names cached and evicted since the last :meth:`take_events` (ordered sets).
        self._stored: dict[str, None] = {}
        self._evicted: dict[str, None] = {}

    @property
    def used(self) -> int:
        """Blocks held by running sequences (the cached free ones excluded)."""
        return len(self._held) + self._private

    @property
    def usage(self) -> float:
        """The fraction of the pool that running sequences hold (vLLM's KV cache usage)."""
        return self.used / self.capacity

    @property
    def available(self) -> int:
        """Blocks that an allocation can have: the empty ones plus the evictable cached ones."""
        return self.capacity - self.used

    def cached(self, name: str) -> bool:
        return name in self._held or name in self._free_cached

    def match(self, names: Sequence[str]) -> int:
        """How many of ``names``, from the first, the cache holds (a prefix hit)."""
        hit = 0
        for name in names:
            if not self.cached(name):
                break
            hit += 1
        return hit

    def acquire(self, names: Sequence[str]) -> None:
        """Hold cached blocks (found by :meth:`match`) for a sequence."""
        for name in names:
            if name in self._free_cached:
                del self._free_cached[name]
                self._held[name] = 1
            else:
                self._held[name] += 1

    def allocate(self, count: int) -> bool:
        """Take ``count`` private blocks, evicting the least recently freed cached blocks
        if need be; False (and nothing taken) if even that is not enough."""
        if count > self.available:
            return False
        empty = self.capacity - self.used - len(self._free_cached)
        for _ in range(count - empty):
            name, _ = self._free_cached.popitem(last=False)
            if name in self._stored:  # cached and evicted within one step: no news at all
                del self._stored[name]
            else:
                self._evicted[name] = None
        self._private += count
        return True

    def name(self, name: str) -> None:
        """A sequence's private block now holds the full prompt block ``name``: it joins
        the prefix cache. If another sequence computed the same block meanwhile, this
        sequence shares that one and its own copy goes back to the pool."""
        self._private -= 1
        if self.cached(name):
            self.acquire((name,))
            return
        self._held[name] = 1
        self._evicted.pop(name, None)
        self._stored[name] = None

    def release(self, names: Sequence[str], private: int) -> None:
        """A sequence gives back its blocks: named ones it alone held stay cached, its
        prefix's tail first in line for eviction (as vLLM frees a request's blocks: the
        tail of a prompt is the least likely part to be shared)."""
        self._private -= private
        for name in reversed(names):
            refs = self._held[name] - 1
            if refs:
                self._held[name] = refs
            else:
                del self._held[name]
                self._free_cached[name] = None

    def take_events(self) -> tuple[list[str], list[str]]:
        """The names cached and evicted since the last call."""
        stored, evicted = list(self._stored), list(self._evicted)
        self._stored.clear()
        self._evicted.clear()
        return stored, evicted
