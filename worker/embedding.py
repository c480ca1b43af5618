"""The mock's embeddings: deterministic unit vectors, alike for texts that share words.

A text's vector is the normalized sum of one pseudo-random vector per whitespace
token, read from SHAKE-256 of the seed and the token: the same text and seed give
the same vector in every process, and texts that share words point in similar
directions, as embeddings of related texts do, so a retrieval test over them finds
what it should. SHAKE's output is a stream, so a vector of ``d`` dimensions is
the first ``d`` components of a longer one, renormalized (as OpenAI's
text-embedding-3 models shorten theirs).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from llmq.model.tokenizer import TOKENIZERS

#: Inputs embedded on the event loop; a larger batch goes to a thread, so that the
#: worker's other streams keep flowing meanwhile.
INLINE_INPUTS = 8


#: Tokens summed in one big integer: 32-bit lanes of 16-bit values cannot carry over.
LANE_TOKENS = 65_536


def _lanes(token: str, seed: int, dimensions: int) -> int:
    """The token's pseudo-random components (16-bit, unsigned) in 32-bit lanes of one
    integer: adding the integers of many tokens adds their vectors component-wise, in
    C, instead of one Python addition per component per token."""
    raw = hashlib.shake_256(f"{seed}:{token}".encode()).digest(2 * dimensions)
    wide = bytearray(4 * dimensions)
    wide[0::4] = raw[0::2]
    wide[1::4] = raw[1::2]
    return int.from_bytes(wide, "little")


def embed_text(text: str, dimensions: int, seed: int = 0) -> list[float]:
    """The unit vector of ``text`` (``dimensions`` components)."""
    tokens = TOKENIZERS["whitespace"].tokens(text) or [text]
    total = [0] * dimensions
    for start in range(0, len(tokens), LANE_TOKENS):
        chunk = tokens[start : start + LANE_TOKENS]
        summed = sum(_lanes(t, seed, dimensions) for t in chunk)
        lanes = struct.unpack(f"<{dimensions}I", summed.to_bytes(4 * dimensions, "little"))
        offset = 32768 * len(chunk)  # each component is centred: 0..65535 less 32768
        total = [a + lane - offset for a, lane in zip(total, lanes, strict=True)]
    norm = math.sqrt(sum(v * v for v in total))
    if norm == 0:
        return [1.0] + [0.0] * (dimensions - 1)
    return [v / norm for v in total]


@dataclass(frozen=True)
class HashEmbedder:
    """The mock model's :class:`~llmq.model.interface.Embedder`."""

    #: Components of a vector when the request does not ask for a number.
    dimensions: int = 1536

    async def embed(
        self, texts: Sequence[str], dimensions: int | None, seed: int
    ) -> list[list[float]]:
        size = dimensions or self.dimensions
        if len(texts) <= INLINE_INPUTS:
            return [embed_text(t, size, seed) for t in texts]
        return await asyncio.to_thread(lambda: [embed_text(t, size, seed) for t in texts])
