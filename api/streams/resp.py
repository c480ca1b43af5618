"""The relay's ``XREAD``, packed as RESP by hand.

With hundreds of followed streams the command is mostly keys and positions; the
relay (:mod:`api.streams.relay`) keeps each one as a RESP bulk string (:func:`bulk`),
encoded when it changes, not on every read (most streams did not move since the
last one), and :func:`xread` joins them into the command it sends.
"""

from __future__ import annotations

from collections.abc import Sequence


def bulk(text: str) -> bytes:
    """One RESP bulk string."""
    data = text.encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


def xread(count: int, block_ms: int, keys: Sequence[bytes], ids: Sequence[bytes]) -> bytes:
    """``XREAD COUNT c BLOCK ms STREAMS keys... ids...`` as RESP, ready to send;
    ``keys`` and ``ids`` are bulk strings (:func:`bulk`), one id per key."""
    head = b"*%d\r\n$5\r\nXREAD\r\n$5\r\nCOUNT\r\n%s$5\r\nBLOCK\r\n%s$7\r\nSTREAMS\r\n" % (
        6 + len(keys) + len(ids),
        bulk(str(count)),
        bulk(str(block_ms)),
    )
    return b"".join([head, *keys, *ids])
