"""Named sets of the mock engine's figures: what a step costs and how big the cache is.

``default`` keeps the mock's historical figures (50 tokens/s per sequence whatever
the batch, a cheap prefill), so that benchmarks stay comparable with earlier runs.
The others are calibrated to a real model on a real GPU, where prefill is expensive
enough that a prefix cache (and routing to it) matters; docs/routing.md ("The mock
engine") gives their sources.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmq.model.blocks import BLOCK_SIZE


@dataclass(frozen=True)
class EngineProfile:
    """A step costs ``step_seconds`` plus a cost per prefill and per decode token."""

    name: str
    #: A step's base time: with no other work, one decode token per sequence per step.
    step_seconds: float
    prefill_token_seconds: float
    decode_token_seconds: float
    #: KV cache capacity, in blocks of ``block_size`` tokens.
    kv_blocks: int
    #: Most tokens one step computes (vLLM's ``max_num_batched_tokens``).
    step_token_budget: int
    block_size: int = BLOCK_SIZE


DEFAULT = EngineProfile(
    "default",
    step_seconds=1 / 50,
    prefill_token_seconds=0.0001,
    decode_token_seconds=0.0,
    kv_blocks=16384,
    step_token_budget=8192,
)

#: Llama-3-8B (BF16) on one H100 SXM 80GB; see docs/routing.md for the sources.
LLAMA3_8B_H100 = EngineProfile(
    "llama3-8b-h100",
    step_seconds=0.0065,
    prefill_token_seconds=0.00005,
    decode_token_seconds=0.00002,
    kv_blocks=28000,
    step_token_budget=8192,
)

PROFILES: dict[str, EngineProfile] = {p.name: p for p in (DEFAULT, LLAMA3_8B_H100)}
