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

#: Llama-3.3-70B-Instruct, FP8, on two H100 80GB (tensor parallel 2), calibrated to
#: NVIDIA's NIM 1.8.0 benchmark at concurrency 1 (docs/routing.md, "The mock engine"):
#: a decode step of 18.6 ms, 79.8 µs per prompt token; the KV capacity is estimated.
LLAMA3_70B_H100X2 = EngineProfile(
    "llama3-70b-h100x2",
    step_seconds=0.0186,
    prefill_token_seconds=0.0000798,
    decode_token_seconds=0.00002,
    kv_blocks=13000,
    step_token_budget=8192,
)

PROFILES: dict[str, EngineProfile] = {p.name: p for p in (DEFAULT, LLAMA3_70B_H100X2)}
