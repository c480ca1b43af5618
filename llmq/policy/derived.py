"""Values of the pool policy that the pool knows rather than guesses: from what a
model's live workers declare in the registry (:class:`llmq.schema.WorkerInfo`).

- ``routing_tokenizer``: the tokenizer they declare, where they all declare the same
  one the API has (a worker that names none counts its prompts as the mock does);
- ``max_prompt_tokens`` and ``max_tokens_limit``: the shortest context length among
  them, where they declare one (the engine's ``max_model_len`` or ``n_ctx``);
- ``routing``: ``prefix`` where every one serves an engine that keeps a prefix cache
  (:data:`PREFIX_CACHES`), else ``least-loaded``, where they all serve an upstream
  engine. The mock's workers derive no routing: a pool of mocks keeps the default,
  ``fifo``, the baseline the benchmarks compare the routing policies with.

A model none of whose workers is live derives nothing: the defaults hold. Each of
these may be overridden in the pool's or the model's document.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from llmq.model.tokenizer import TOKENIZERS, WHITESPACE
from llmq.schema import WorkerInfo

#: The engines that keep a prefix cache (llama.cpp's slot cache, vLLM's and SGLang's
#: automatic prefix caching): routing a prompt to the worker holding its prefix pays.
PREFIX_CACHES = frozenset({"llamacpp", "vllm", "sglang"})


def derive(workers: Iterable[WorkerInfo]) -> dict[str, dict[str, Any]]:
    """Per model, the values its live ``workers`` give."""
    by_model: dict[str, list[WorkerInfo]] = {}
    for w in workers:
        by_model.setdefault(w.model, []).append(w)
    out: dict[str, dict[str, Any]] = {}
    for model, found in by_model.items():
        values: dict[str, Any] = {}
        names = {w.tokenizer or WHITESPACE.name for w in found}
        if len(names) == 1 and (name := names.pop()) in TOKENIZERS:
            values["routing_tokenizer"] = name
        lengths = [w.context_length for w in found if w.context_length]
        if lengths:
            values["max_prompt_tokens"] = values["max_tokens_limit"] = min(lengths)
        engines = [(w.upstream or {}).get("engine") for w in found]
        if all(e is not None for e in engines):
            cached = all(e in PREFIX_CACHES for e in engines)
            values["routing"] = "prefix" if cached else "least-loaded"
        out[model] = values
    return out
