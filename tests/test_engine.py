"""The mock's engine model on its own: step budget, prefix reuse, eviction, preemption.

The cache and the scheduler are pure bookkeeping, so these tests drive steps by hand
(``schedule`` then ``complete``) and never wait on a clock.
"""

from __future__ import annotations

import pytest

from worker.mock_engine.kv_cache import KVCache
from worker.mock_engine.scheduler import EngineSequence, Scheduler, Step


def sequence(names: list[str], tokens: int) -> EngineSequence:
    return EngineSequence(list(names), prompt_tokens=tokens, tokens=tokens)


def step(scheduler: Scheduler) -> tuple[Step, list[EngineSequence]]:
    """One step: what it computed, and who sampled a token at its end."""
    planned = scheduler.schedule()
    return planned, scheduler.complete(planned)


def until_first_token(scheduler: Scheduler, target: EngineSequence) -> list[Step]:
    steps = []
    for _ in range(100):
        planned, sampled = step(scheduler)
        steps.append(planned)
        if target in sampled:
            return steps
    raise AssertionError("no first token in 100 steps")


def test_a_step_computes_decode_tokens_first_then_prefill_chunks_within_its_budget() -> None:
    scheduler = Scheduler(KVCache(capacity=1000, block_size=16), token_budget=64)
    decoders = [sequence([], 10), sequence([], 10)]
    for d in decoders:
        scheduler.add(d)
    step(scheduler)  # both prefilled: they decode from now on
    long = sequence([], 200)
    scheduler.add(long)
    steps = until_first_token(scheduler, long)
    for planned in steps:
        assert planned.decode_tokens + planned.prefill_tokens <= 64
        assert all(planned.work[d] == 1 for d in decoders)  # nobody's decode waits
    # 200 prompt tokens in chunks of what the decodes leave: 62 per step
    assert [s.prefill_tokens for s in steps] == [62, 62, 62, 14]


def test_a_prompt_reuses_its_cached_prefix_in_whole_blocks_from_the_start() -> None:
    cache = KVCache(capacity=100, block_size=16)
    scheduler = Scheduler(cache, token_budget=1000)
    first = sequence(["a", "b", "c", "d"], 64)
    scheduler.add(first)
    until_first_token(scheduler, first)
    assert first.cached_tokens == 0
    scheduler.remove(first)
    # shares a and b; its third block differs (and so does every name after it)
    other = sequence(["a", "b", "x", "y"], 70)
    scheduler.add(other)
    (planned,) = until_first_token(scheduler, other)
    assert other.cached_tokens == 32
    assert planned.prefill_tokens == 70 - 32
    # the same prompt again: every block but the one holding its last token
    again = sequence(["a", "b", "c", "d"], 64)
    scheduler.add(again)
    (planned,) = until_first_token(scheduler, again)
    assert again.cached_tokens == 48
    assert planned.prefill_tokens == 16
    # a running sequence's blocks are shared, not copied: 4 named blocks in the pool
    # once, plus each sequence's private ones
    assert cache.used == again.blocks + other.blocks - 2


def test_the_cache_reports_blocks_once_computed_and_evicts_the_least_recently_freed() -> None:
    cache = KVCache(capacity=6, block_size=4)
    scheduler = Scheduler(cache, token_budget=1000)
    for names in (["x1", "x2"], ["y1", "y2"]):
        s = sequence(names, 8)
        scheduler.add(s)
        scheduler.schedule()  # not complete: nothing is cached until computed
        assert cache.take_events() == ([], [])
        scheduler.remove(s)
        s = sequence(names, 8)
        scheduler.add(s)
        until_first_token(scheduler, s)
        assert cache.take_events() == (names, [])
        scheduler.remove(s)
    # 4 cached blocks, 2 empty; 4 more needed: x's blocks go, the tail first
    big = sequence([], 16)
    scheduler.add(big)
    until_first_token(scheduler, big)
    assert cache.take_events() == ([], ["x2", "x1"])
    scheduler.remove(big)
    assert cache.match(["y1", "y2"]) == 2
    assert cache.match(["x1", "x2"]) == 0


def test_a_block_cached_and_evicted_within_one_step_is_not_reported() -> None:
    cache = KVCache(capacity=2, block_size=4)
    cache.allocate(1)
    cache.name("a")
    cache.release(["a"], 0)
    assert cache.allocate(2)
    assert cache.take_events() == ([], [])


def test_when_blocks_run_out_the_newest_sequence_is_preempted_and_recomputed_later() -> None:
    cache = KVCache(capacity=4, block_size=4)
    scheduler = Scheduler(cache, token_budget=1000)
    old, new = sequence(["o1"], 5), sequence(["n1"], 5)
    scheduler.add(old)
    scheduler.add(new)
    step(scheduler)  # each holds 2 blocks: 5 tokens, the sixth sampled
    preempted: list[EngineSequence] = []
    produced = {id(old): 0, id(new): 0}
    for _ in range(4):  # the 9th token's state needs a third block each
        planned, sampled = step(scheduler)
        preempted += planned.preempted
        for s in sampled:
            produced[id(s)] += 1
    assert preempted == [new]
    assert produced[id(old)] == 4  # the older one never stopped
    assert scheduler.waiting[0] is new and new.computed == 0 and new.blocks == 0
    tokens = new.tokens
    scheduler.remove(old)
    (planned,) = until_first_token(scheduler, new)
    # recomputed: its prompt's cached block is reused, the rest (its tokens) computed again
    assert planned.work[new] == tokens - 4
    assert new.tokens == tokens + 1 and new.preemptions == 1
    assert new.cached_tokens == 0  # as first admitted


def test_a_sequence_larger_than_the_whole_cache_fails_instead_of_waiting_forever() -> None:
    scheduler = Scheduler(KVCache(capacity=2, block_size=4), token_budget=1000)
    huge, small = sequence([], 20), sequence([], 3)
    scheduler.add(huge)
    scheduler.add(small)
    planned = scheduler.schedule()
    assert [s for s, _ in planned.failed] == [huge]
    assert "needs 6 KV blocks" in str(planned.failed[0][1])
    assert list(planned.work) == [small]


def test_cache_and_budget_sizes_are_checked() -> None:
    with pytest.raises(ValueError):
        KVCache(capacity=0, block_size=16)
    with pytest.raises(ValueError):
        Scheduler(KVCache(capacity=1, block_size=16), token_budget=0)
