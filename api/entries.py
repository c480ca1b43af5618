"""Stream entries as events, token events on a fast path.

The relay (:mod:`api.streams.relay`) reads every entry of every followed stream, and token
events are nearly all of them: they are decoded without ``json.loads`` or
pydantic's validator (:func:`decode_data`); anything else goes the validating way
(:func:`llmq.schema.decode_event`).
"""

from __future__ import annotations

import logging
from json.decoder import scanstring  # type: ignore[attr-defined]

from llmq.schema import Event, TokensEvent, decode_event, tokens_event

log = logging.getLogger(__name__)

#: How a token event written by a worker begins; the index follows.
_TOKENS_HEAD = '{"type":"tokens","index":'
_TOKENS_LIST = ',"tokens":['


def decode_data(raw: str) -> Event | None:
    """The event in a stream entry's ``data`` field; None for a malformed one.

    A token event of exactly the shape the workers write is read by
    :func:`_token_event`; anything else goes through :func:`llmq.schema.decode_event`,
    which validates it and logs what it skips.
    """
    if raw.startswith(_TOKENS_HEAD):
        event = _token_event(raw)
        if event is not None:
            return event
    return decode_event({"data": raw})


def _token_event(raw: str) -> TokensEvent | None:
    """``{"type":"tokens","index":N,"tokens":["...",...]}`` without ``json.loads``.

    This runs for every token the API relays. ``json.loads`` spends most of its
    time in its Python wrappers around the C scanner, and ``model_construct`` in a
    loop over the model's fields; here the index is read with ``int``, each token
    with the C string scanner (``json.decoder.scanstring``, the one ``json.loads``
    uses, so escapes and errors are the same), and the event is assembled as
    ``model_construct`` would. Anything else (whitespace, other fields, a key order
    the workers do not write) returns None and goes the validating way.
    """
    start = len(_TOKENS_HEAD)
    end = raw.find(_TOKENS_LIST, start)
    digits = raw[start:end]
    if end < 0 or not (digits.isascii() and digits.isdigit()) or digits[0] == "0" != digits:
        return None
    pos = end + len(_TOKENS_LIST)
    tokens: list[str] = []
    try:
        while True:
            if raw[pos] != '"':
                return None
            token, pos = scanstring(raw, pos + 1)
            tokens.append(token)
            if raw[pos] != ",":
                break
            pos += 1
    except (ValueError, IndexError):
        return None
    if raw[pos:] != "]}":
        return None
    return tokens_event(int(digits), tokens)


def _data_field(fields: list[str]) -> str | None:
    """The value of ``data`` in a flat ``[name, value, ...]`` entry."""
    if len(fields) == 4 and fields[2] == "data":  # how the workers write it: type, data
        return fields[3]
    for i in range(0, len(fields) - 1, 2):
        if fields[i] == "data":
            return fields[i + 1]
    return None


def entry_event(fields: list[str]) -> Event | None:
    """The event a stream entry carries; None (logged) for one without ``data``."""
    raw = _data_field(fields) if fields else None
    if raw is None:
        log.warning("skipping stream entry without data: %r", fields)
        return None
    return decode_data(raw)
