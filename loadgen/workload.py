"""What each request asks for: its prompt, its ``max_tokens`` and its priority.

Request ``i`` is a pure function of ``(seed, i)``: it draws from its own
``numpy`` generator seeded with ``[seed, stream, i]``. So the traffic is
reproducible, it can be produced lazily (a closed loop bounded only by a
duration does not know how many requests it will need), and changing the
arrival process does not change the prompts. The HTTP run and the in-process
baseline therefore see identical requests.

Synthetic prompts are ``prompt_tokens`` whitespace-separated words (the mock's
tokenizer counts whitespace tokens): a per-request tag, so that no two prompts are
equal and no prompt cache can flatter the numbers, then a slice at a random offset
of a seeded random word sequence.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llmq.model.tokenizer import count_tokens
from loadgen.config import LoadConfig
from worker.mock import WORDS

_MEASURED, _WARMUP = 1, 2  # generator streams: warmup requests never reuse measured ones


@dataclass(frozen=True)
class RequestSpec:
    """One request to send. ``priority`` None means the body omits the field."""

    index: int
    prompt: str
    prompt_tokens: int
    max_tokens: int
    priority: int | None = None


@dataclass(frozen=True)
class DatasetEntry:
    prompt: str
    max_tokens: int
    priority: int | None = None


def load_dataset(path: str | Path) -> list[DatasetEntry]:
    """Read ``{"prompt": str, "max_tokens": int, "priority": int?}`` lines; blank lines skip."""
    entries: list[DatasetEntry] = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                prompt, max_tokens = row["prompt"], row["max_tokens"]
                priority = row.get("priority")
                valid = (
                    isinstance(prompt, str)
                    and isinstance(max_tokens, int)
                    and max_tokens >= 1
                    and (priority is None or isinstance(priority, int))
                )
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise ValueError(f"{path}:{number}: not a dataset line: {exc}") from exc
            if not valid:
                raise ValueError(f"{path}:{number}: bad prompt/max_tokens/priority types")
            entries.append(DatasetEntry(prompt, max_tokens, priority))
    if not entries:
        raise ValueError(f"{path}: the dataset is empty")
    return entries


class Workload:
    """Produces :class:`RequestSpec` ``i`` for a configuration, deterministically."""

    def __init__(self, config: LoadConfig) -> None:
        self._config = config
        self._dataset = load_dataset(config.dataset) if config.dataset else None
        # Prompt bodies are slices of one seeded word sequence: drawing every word per
        # request costs time per word of a long prompt, a slice costs one copy.
        size = max(4 * config.prompt_tokens[1], 65_536)
        picks = np.random.default_rng([config.seed, 0, 1]).integers(0, len(WORDS), size=size)
        self._pool = [WORDS[int(k)] for k in picks]
        mix = config.priority_mix
        self._priorities = [p for p, _ in mix] if mix else None
        weights = np.array([w for _, w in mix], dtype=float) if mix else None
        self._weights = weights / weights.sum() if weights is not None else None
        if self._dataset is not None:
            n = len(self._dataset)
            self._orders = {
                stream: np.random.default_rng([config.seed, stream, 0]).permutation(n)
                for stream in (_MEASURED, _WARMUP)
            }

    def spec(self, index: int, *, warmup: bool = False) -> RequestSpec:
        stream = _WARMUP if warmup else _MEASURED
        rng = np.random.default_rng([self._config.seed, stream, index + 1])
        priority = self._draw_priority(rng)
        if self._dataset is not None:
            order = self._orders[stream]
            entry = self._dataset[int(order[index % len(order)])]
            return RequestSpec(
                index=index,
                prompt=entry.prompt,
                prompt_tokens=count_tokens(entry.prompt),
                max_tokens=entry.max_tokens,
                priority=entry.priority if entry.priority is not None else priority,
            )
        n_prompt = _uniform(rng, self._config.prompt_tokens)
        max_tokens = _uniform(rng, self._config.output_tokens)
        tag = f"{'w' if warmup else 'r'}{index}-s{self._config.seed}"
        offset = int(rng.integers(0, len(self._pool) - n_prompt + 2))
        prompt = " ".join([tag, *self._pool[offset : offset + n_prompt - 1]])
        return RequestSpec(index, prompt, n_prompt, max_tokens, priority)

    def _draw_priority(self, rng: np.random.Generator) -> int | None:
        if self._priorities is None or self._weights is None:
            return None
        return self._priorities[int(rng.choice(len(self._priorities), p=self._weights))]


def _uniform(rng: np.random.Generator, bounds: tuple[int, int]) -> int:
    low, high = bounds
    return low if low == high else int(rng.integers(low, high + 1))
