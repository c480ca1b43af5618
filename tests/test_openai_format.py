"""OpenAI chunk framing: the per-token fast path encodes exactly what the slow one does."""

from __future__ import annotations

import pytest

from api.admission.submit import Submitted
from api.openai_format import ChatFormat, CompletionFormat
from api.streams import event_stream


@pytest.mark.parametrize("fmt_class", [CompletionFormat, ChatFormat])
@pytest.mark.parametrize("usage", [False, True])
@pytest.mark.parametrize(
    "text",
    [
        " fox",
        "",
        'say "hi"\n',
        "naïve ☃ \\ \x00 \u2028",
        "\x01\x1f\x7f\t\r\b\f",
        "😀👍🏽 中文",
        "\ud800",
        '\\u0041 \\" </script>',
        '","choices":[',
        "\x00text\x00",
    ],
)
def test_delta_frames_are_the_encoded_delta_chunks(
    fmt_class: type[CompletionFormat], usage: bool, text: str
) -> None:
    sub = Submitted("abc", "mock", 1, 3, 5, 0.0)
    fmt = fmt_class([sub], usage)
    assert fmt.delta_frame(text) == event_stream.data(fmt.delta(text))
    assert fmt.delta_frame(text) == event_stream.data(fmt.delta(text))  # from the cached parts
