"""A prompt's leading KV blocks, named by chained hashes.

An engine caches attention state in blocks of ``block_size`` tokens; a block is
reusable only with every block before it, so each block is named by a hash of its
tokens and of the previous block's name (as vLLM's prefix cache does). Two prompts
share their first ``n`` names exactly when they share their first ``n`` full
blocks. The API computes these at admission (routing), the mock's engine computes
the same for its cache, so the names agree.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

#: Tokens per block: vLLM's default.
BLOCK_SIZE = 16


def block_hashes(
    tokens: Sequence[str], block_size: int = BLOCK_SIZE, limit: int | None = None
) -> list[str]:
    """The chained names of the full blocks of ``tokens`` (at most ``limit`` of them):
    16 hex digits each, the first naming block 0 alone, each next one its whole prefix."""
    names: list[str] = []
    previous = b""
    full = len(tokens) // block_size
    if limit is not None:
        full = min(full, limit)
    for start in range(0, full * block_size, block_size):
        digest = hashlib.blake2b(previous, digest_size=8)
        digest.update("\x1f".join(tokens[start : start + block_size]).encode())
        previous = digest.digest()
        names.append(previous.hex())
    return names
