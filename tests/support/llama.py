"""llama.cpp's ``llama-server`` as the tests' real inference server (see :mod:`rigs.llama`).

A :class:`LlamaServer` is a logged child process on a port of its own, started
on the session's tiny random model; it can be killed (a crashed engine) and
started again on the same port (the engine back). Without the server binary the
test fails (``scripts/llama-server.sh`` builds it; CI runs that first).
"""

from __future__ import annotations

import asyncio
import signal
import tempfile
from pathlib import Path
from typing import Any

import httpx

from cli.supervisor import LoggedProcess
from llmq.embedded import free_port
from rigs.llama import busy_slots, llama_server_argv, wait_ready

#: The name the tests' workers serve the tiny model under.
MODEL = "tiny"


class LlamaServer:
    def __init__(
        self, model: Path, *, slots: int = 2, context: int = 4096, chat_template: Path | None = None
    ) -> None:
        self.model = model
        self.slots = slots
        self.context = context
        self.chat_template = chat_template
        self.port = free_port()
        self.process: LoggedProcess | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> LlamaServer:
        # token by token: a resumed run must reproduce the uninterrupted one exactly
        argv = llama_server_argv(
            self.model,
            self.port,
            slots=self.slots,
            context=self.context,
            token_by_token=True,
            chat_template=self.chat_template,
        )
        log = Path(tempfile.mkstemp(prefix="llama-server-", suffix=".log")[1])
        self.process = LoggedProcess(argv, {}, log, name="llama-server")
        try:
            await asyncio.to_thread(wait_ready, self.url, self.process.popen)
        except BaseException:
            raise AssertionError(f"llama-server did not start:\n{self.process.tail()}") from None
        return self

    def kill(self) -> None:
        """A crash: SIGKILL, waited for."""
        if self.process is not None:
            self.process.signal(signal.SIGKILL)
            self.process.wait_stopped(10)

    def pause(self, paused: bool) -> None:
        """SIGSTOP (a hung engine: connections open, nothing answers) or SIGCONT."""
        if self.process is not None:
            self.process.signal(signal.SIGSTOP if paused else signal.SIGCONT)

    def stop(self) -> None:
        self.pause(False)  # a stopped process would not see SIGTERM
        if self.process is not None:
            self.process.stop(10)

    async def busy(self) -> int:
        return await asyncio.to_thread(busy_slots, self.url)

    async def decoded(self) -> int:
        """Tokens the busy slot has generated for its sequence (0 when idle)."""
        async with httpx.AsyncClient(base_url=self.url) as client:
            slots = (await client.get("/slots")).json()
        return sum(
            int(token.get("n_decoded", 0))
            for slot in slots
            if slot.get("is_processing")
            for token in slot.get("next_token") or ()
        )

    async def predicted(self) -> int:
        """Tokens the server generated so far (its ``/metrics``)."""
        return await self._metric("tokens_predicted_total")

    async def deferred(self) -> int:
        """Requests waiting in the server's own queue for a slot (its ``/metrics``)."""
        return await self._metric("requests_deferred")

    async def _metric(self, name: str) -> int:
        async with httpx.AsyncClient(base_url=self.url) as client:
            text = (await client.get("/metrics")).text
        for line in text.splitlines():
            if line.startswith(f"llamacpp:{name} "):
                return int(float(line.split()[-1]))
        raise AssertionError(f"no {name} in /metrics:\n{text[:2000]}")

    def worker_settings(self, **more: Any) -> dict[str, Any]:
        """A worker driving this server (its slots are the worker's cap, from /props)."""
        return {
            "model": MODEL,
            "backend": "openai",
            "upstream_url": self.url,
            "upstream_probe_seconds": 0.2,
            "upstream_timeout_seconds": 10,
            **more,
        }
