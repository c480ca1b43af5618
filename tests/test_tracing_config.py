"""Tracing is configured by the standard ``OTEL_*`` variables alone, and off by default
(:func:`llmq.tracing.exporters`); what it sends is tested against a real trace backend
in ``tests/test_tracing.py``."""

from __future__ import annotations

import pytest

from llmq import tracing

pytestmark = pytest.mark.timeout(10)

VARIABLES = (
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, []),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, ["otlp"]),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, ["otlp"]),
        ({"OTEL_TRACES_EXPORTER": "console,otlp"}, ["console", "otlp"]),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"}, []),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, []),
        ({"OTEL_SDK_DISABLED": "false", "OTEL_TRACES_EXPORTER": "otlp"}, ["otlp"]),
    ],
)
def test_tracing_is_on_only_where_the_environment_names_an_exporter(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: list[str]
) -> None:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert tracing.exporters() == expected


def test_off_nothing_is_set_up_and_no_context_is_carried(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert tracing.setup("llmq-test") is False
    assert not tracing.enabled()
    assert tracing.carrier() is None
    assert tracing.start_engine("http://127.0.0.1:1/v1/completions", "m") is None
