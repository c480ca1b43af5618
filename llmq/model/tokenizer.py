"""Tokenizers the API and the workers share, so that both cut a prompt alike.

The API sizes a prompt at admission (the context-length check, the admitted
``prompt_tokens``) and hashes its leading blocks for cache-aware routing
(:mod:`llmq.model.blocks`); a worker's engine caches the same blocks. Both must
cut the text the same way, so the tokenizer is part of the model's declaration:

- ``whitespace``: the mock's tokens are whitespace-separated words, exactly.
- ``chars``: for a backend whose tokenizer the API does not have (an inference
  server's), a token is approximated by a fixed number of characters, as llm-d's
  approximate prefix scorer does; its counts are estimates, and a backend that
  knows better reports the true count (:class:`~llmq.model.interface.Report`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class Tokenizer(Protocol):
    """Cuts text into tokens (strings, so that hashing needs no vocabulary)."""

    @property
    def name(self) -> str: ...

    def tokens(self, text: str) -> list[str]: ...

    def count(self, text: str) -> int: ...


@dataclass(frozen=True)
class WhitespaceTokenizer:
    """The mock's tokenizer: a token is a whitespace-separated word."""

    name: str = "whitespace"

    def tokens(self, text: str) -> list[str]:
        return text.split()

    def count(self, text: str) -> int:
        return len(text.split())


@dataclass(frozen=True)
class CharTokenizer:
    """An approximation: one token per ``chars_per_token`` characters (rounded up).

    Four characters per token is the usual figure for English text with BPE
    vocabularies; the estimate is for admission and routing only.
    """

    chars_per_token: int = 4
    name: str = "chars"

    def tokens(self, text: str) -> list[str]:
        step = self.chars_per_token
        return [text[i : i + step] for i in range(0, len(text), step)]

    def count(self, text: str) -> int:
        return -(-len(text) // self.chars_per_token)


WHITESPACE = WhitespaceTokenizer()
CHARS = CharTokenizer()

#: By the name a worker declares.
TOKENIZERS: dict[str, Tokenizer] = {WHITESPACE.name: WHITESPACE, CHARS.name: CHARS}


def count_tokens(text: str) -> int:
    """Whitespace tokens: the mock's tokenizer, which the API also sizes prompts with."""
    return len(text.split())
