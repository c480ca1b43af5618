"""Support for the many-host tests: a cluster of namespaces and programs on its client host."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from rigs.hosts import Stack, start_stack
from rigs.netns import Cluster, HostProcess
from tests.support.waiting import wait_until


def require_netns() -> None:
    """Skip unless this process may create network namespaces."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")


def cluster_stack(**kwargs: Any) -> Iterator[Stack]:
    """A cluster with llmq started on it; everything is removed afterwards, pass or fail."""
    require_netns()
    with Cluster() as cluster:
        yield start_stack(cluster, **kwargs)


@dataclass
class ClientRun:
    """A run of :mod:`tests.support.hosts_client` on the client host, read from its
    JSON lines."""

    proc: HostProcess

    def lines(self) -> list[dict[str, Any]]:
        out = []
        for line in self.proc.output().splitlines():
            if line.startswith("{"):
                out.append(json.loads(line))
        return out

    def ended(self) -> bool:
        return any("end" in x or "error" in x for x in self.lines())

    async def wait(self, predicate: Any, *, timeout: float, what: str) -> list[dict[str, Any]]:
        def check() -> bool:
            if not self.proc.running() and not predicate(self.lines()):
                raise AssertionError(f"client exited before {what}:\n{self.proc.output()}")
            return bool(predicate(self.lines()))

        await wait_until(check, timeout=timeout, what=what, interval=0.02)
        return self.lines()

    async def finish(self, timeout: float) -> list[dict[str, Any]]:
        return await self.wait(lambda _: not self.proc.running(), timeout=timeout, what="exit")


def client(stack: Stack, *args: str) -> ClientRun:
    argv = [sys.executable, "-m", "tests.support.hosts_client", *args]
    return ClientRun(stack.cluster.run("client", argv, name="client"))


def openai_text(lines: list[dict[str, Any]]) -> str:
    return "".join(x.get("text", "") for x in lines)


async def record(stack: Stack, rid: str, api: str = "api2") -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=5) as http:
        r = await http.get(f"{stack.api_url(api)}/v1/requests/{rid}")
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


async def expected_text(stack: Stack, body: dict[str, Any], api: str = "api2") -> str:
    """The text of an undisturbed, non-streaming run of ``body``."""
    async with httpx.AsyncClient(timeout=60) as http:
        r = await http.post(f"{stack.api_url(api)}/v1/completions", json=body)
    assert r.status_code == 200, r.text
    text: str = r.json()["choices"][0]["text"]
    return text


async def wait_api_ready(stack: Stack, api: str, timeout: float = 30) -> None:
    async def ready() -> bool:
        try:
            async with httpx.AsyncClient(timeout=1) as http:
                return (await http.get(stack.api_url(api) + "/readyz")).status_code == 200
        except httpx.HTTPError:
            return False

    await wait_until(ready, timeout=timeout, what=f"{api} to be ready")
