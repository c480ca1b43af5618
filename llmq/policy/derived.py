"""Values of the pool policy that the pool knows rather than guesses: from what a
model's live workers declare in the registry (:class:`llmq.schema.WorkerInfo`).

- ``routing_tokenizer``: the tokenizer they declare, where they all declare the same
  one the API has (a worker that names none counts its prompts as the mock does);
- ``max_prompt_tokens`` and ``max_tokens_limit``: the shortest context length among
  them, where they declare one (the engine's ``max_model_len`` or ``n_ctx``);
- ``routing``: ``prefix`` where every one declares a prefix cache (the mock's KV
  cache, an upstream engine of :data:`PREFIX_CACHES`), else ``least-loaded``: routing
  a prompt to the worker that holds its prefix pays only where they all keep one. An
  entry that predates the declaration is judged by its upstream's engine (the mock's:
  not at all, and its model derives no routing).

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
        caches = [_prefix_cache(w) for w in found]
        if all(c is not None for c in caches):
            values["routing"] = "prefix" if all(caches) else "least-loaded"
        out[model] = values
    return out


def _prefix_cache(worker: WorkerInfo) -> bool | None:
    """Whether ``worker`` keeps a prefix cache, as it declares; for an entry that
    predates the declaration, as its upstream's engine does (None: the mock's, unknown)."""
    if worker.prefix_cache is not None:
        return worker.prefix_cache
    engine = (worker.upstream or {}).get("engine")
    return None if engine is None else engine in PREFIX_CACHES
