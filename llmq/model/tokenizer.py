"""Tokenizers the API and the workers share, so that both count a prompt alike.

The mock's tokenizer splits on whitespace: its tokens are the words it generates.
"""

from __future__ import annotations


def count_tokens(text: str) -> int:
    """Whitespace tokens: the mock's tokenizer, which the API also sizes prompts with."""
    return len(text.split())
