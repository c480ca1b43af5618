"""Arize Phoenix, a real trace backend: it receives OTLP over HTTP at ``/v1/traces`` and
serves the spans back over its REST API (``GET /v1/projects/default/spans``).

Installed in an environment of its own by ``scripts/phoenix.sh`` (cached); the
session's one server (it takes tens of seconds to start) runs on free ports in a
temporary working directory, its telemetry and every download it could make turned
off. Tests tell their traces apart by trace id.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmq.embedded import free_port
from tests.support.processes import LoggedProcess, clean_env, http_status, wait_for
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]

Span = dict[str, Any]


def phoenix_executable() -> str:
    """The ``phoenix`` of ``scripts/phoenix.sh`` (installed on first use: minutes)."""
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "phoenix.sh")],
        capture_output=True,
        text=True,
        check=True,
        timeout=900,
    )
    return done.stdout.strip().splitlines()[-1]


class Phoenix:
    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"

    def otel_env(self, service: str | None = None) -> dict[str, str]:
        """The standard variables that send a process's spans here, exported at once."""
        env = {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.url,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
        if service is not None:
            env["OTEL_SERVICE_NAME"] = service
        return env

    async def spans(self, trace_id: str) -> list[Span]:
        """The spans of ``trace_id`` that Phoenix holds, by start time."""
        async with httpx.AsyncClient(base_url=self.url, timeout=10) as client:
            r = await client.get(
                "/v1/projects/default/spans",
                params={"trace_id": trace_id, "limit": 1000, "sort": "start_time", "order": "asc"},
            )
        if r.status_code == 404:  # no span reached the project yet
            return []
        r.raise_for_status()
        found: list[Span] = r.json()["data"]
        return found

    async def named(self, name: str) -> list[Span]:
        """Every span called ``name`` that Phoenix holds, of any trace (a batch line's
        root, whose trace id no client chose)."""
        found: list[Span] = []
        params: dict[str, str | int] = {"limit": 1000}
        async with httpx.AsyncClient(base_url=self.url, timeout=10) as client:
            while True:
                r = await client.get("/v1/projects/default/spans", params=params)
                if r.status_code == 404:
                    return []
                r.raise_for_status()
                body = r.json()
                found += [s for s in body["data"] if s["name"] == name]
                if not body.get("next_cursor"):
                    return found
                params["cursor"] = body["next_cursor"]

    async def wait_spans(
        self, trace_id: str, done: Callable[[list[Span]], bool], timeout: float = 30
    ) -> list[Span]:
        """The trace's spans once ``done`` holds of them."""
        found: list[Span] = []

        async def complete() -> bool:
            nonlocal found
            found = await self.spans(trace_id)
            return done(found)

        await wait_until(complete, timeout=timeout, what=f"the spans of trace {trace_id}")
        return found


def names(spans: list[Span]) -> list[str]:
    return [s["name"] for s in spans]


def named(spans: list[Span], name: str) -> list[Span]:
    return [s for s in spans if s["name"] == name]


@pytest.fixture(scope="session")
def phoenix() -> Iterator[Phoenix]:
    """The session's Phoenix server."""
    executable = phoenix_executable()
    port, grpc = free_port(), free_port()
    with tempfile.TemporaryDirectory(prefix="llmq-phoenix-") as workdir:
        env = {
            **untraced_env(),
            "PHOENIX_WORKING_DIR": workdir,
            "PHOENIX_HOST": "127.0.0.1",
            "PHOENIX_PORT": str(port),
            "PHOENIX_GRPC_PORT": str(grpc),
            "PHOENIX_TELEMETRY_ENABLED": "false",
            "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",
        }
        proc = LoggedProcess(
            [executable, "serve"], env, Path(workdir) / "phoenix.log", name="phoenix"
        )
        server = Phoenix(port)
        try:
            wait_for(
                lambda: http_status(server.url + "/healthz") == 200,
                180,
                "Phoenix to start",
                proc,
                interval=0.2,
            )
            yield server
        finally:
            proc.stop()


def untraced_env(**extra: str) -> dict[str, str]:
    """A child's clean environment (:func:`tests.support.processes.clean_env`) without
    any ``OTEL_*`` variable the caller's shell exported: tracing as the test says."""
    env = {k: v for k, v in clean_env().items() if not k.startswith("OTEL_")}
    return {**env, **extra}
