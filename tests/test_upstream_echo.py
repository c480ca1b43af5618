"""A re-run's continued text, echoed by some engines and not by others: the worker
drops an echo and keeps new output that merely starts like the published text."""

from __future__ import annotations

import pytest

from worker.backends.openai import _Echo

pytestmark = pytest.mark.timeout(10)


def texts(pieces: list[tuple[str, object]]) -> str:
    return "".join(text for text, _ in pieces)


def test_an_echo_is_dropped_whole_and_what_follows_it_kept() -> None:
    echo = _Echo("byss ab")
    out = [*echo.feed("byss", None), *echo.feed(" a", None), *echo.feed("bq", None)]
    assert texts(out) == "q"
    assert texts(echo.feed("rs", None)) == "rs"


def test_new_output_that_starts_like_the_published_text_is_kept() -> None:
    """No echo (llama.cpp builds that continue without one): the first new token
    equals the published text's first character and must not be taken for an echo."""
    echo = _Echo("byss ab")
    out = [*echo.feed("b", None), *echo.feed("y", None), *echo.feed("q", None)]
    assert texts(out) == "byq"


def test_held_output_is_released_when_the_stream_ends() -> None:
    echo = _Echo("byss ab")
    assert echo.feed("b", None) == []
    assert texts(echo.feed("", None, last=True)) == "b"
