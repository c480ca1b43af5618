"""The in-process baseline: the prototype's single-process server, driven by the same traffic.

The prototype (the "complete serving pipeline" this project replaces) is one
``InferenceServer`` object in the caller's event loop. Admission is a busy-wait:
a request polls every 10 ms while ``active_requests >= max_concurrent``, with no
bound on how many wait, no ordering among waiters (whoever polls first after a
slot frees wins, so neither FIFO nor priority holds) and no rejection. An
admitted request streams the model's tokens. There is no network, no
serialisation and no queue hop, so it is the floor the distributed pipeline's
overhead is measured against, and its polling admission is the behaviour the
pipeline's queue is meant to beat under overload.

This is a reimplementation, not a copy: it runs the project's model
(:class:`worker.mock.MockBackend`, same timings as the workers) instead of the
prototype's, and streams one token per response instead of the cumulative list.
:class:`InProcessTarget` adapts it to the runner: the clock starts when the
request is handed to the server, exactly where the HTTP client starts it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from llmq.model.interface import Backend, GenerationRequest, seed_for
from loadgen.config import LoadConfig
from loadgen.measurements import StreamClock
from loadgen.workload import RequestSpec
from worker.mock import MockBackend

POLL_SECONDS = 0.01  # the prototype's admission poll interval


@dataclass(frozen=True)
class InferenceRequest:
    request_id: str
    prompt: str
    max_tokens: int
    priority: int = 0  # accepted like the prototype's, and likewise ignored by admission


@dataclass(frozen=True)
class InferenceResponse:
    """One streamed step: a new token, or the final marker with the token count."""

    request_id: str
    token: str
    finished: bool
    generated_tokens: int


class InferenceServer:
    """The prototype's server: busy-wait admission capped at ``max_concurrent``, then
    stream."""

    def __init__(
        self, backend: Backend, max_concurrent: int = 10, poll_seconds: float = POLL_SECONDS
    ) -> None:
        self.backend = backend
        self.max_concurrent = max_concurrent
        self.poll_seconds = poll_seconds
        self.active_requests = 0
        self.peak_active = 0  # observability for tests: must never exceed max_concurrent
        self.completed = 0

    async def handle_request(
        self, request: InferenceRequest
    ) -> AsyncGenerator[InferenceResponse, None]:
        # No await between the check and the increment: admission is atomic in asyncio.
        while self.active_requests >= self.max_concurrent:
            await asyncio.sleep(self.poll_seconds)
        self.active_requests += 1
        self.peak_active = max(self.peak_active, self.active_requests)
        try:
            generation = GenerationRequest(
                prompt=request.prompt,
                max_tokens=request.max_tokens,
                seed=seed_for(request.request_id, None),
                prompt_tokens=self.backend.count_tokens(request.prompt),
            )
            count = 0
            async for token in self.backend.generate(generation):
                if not isinstance(token, str):
                    continue  # a report of the model's cache, a tool call's start: no token
                count += 1
                yield InferenceResponse(request.request_id, token, False, count)
            self.completed += 1
            yield InferenceResponse(request.request_id, "", True, count)
        finally:
            self.active_requests -= 1


class InProcessTarget:
    """Sends each request to an :class:`InferenceServer` living in this event loop."""

    name = "in_process"

    def __init__(self, config: LoadConfig) -> None:
        backend = MockBackend(
            tokens_per_second=config.tokens_per_second,
            prefill_seconds_per_token=config.prefill_seconds_per_token,
        )
        self.server = InferenceServer(backend, max_concurrent=config.baseline_concurrency)

    async def prepare(self) -> None:
        return None

    async def aclose(self) -> None:
        return None

    async def send(self, spec: RequestSpec, clock: StreamClock) -> None:
        request = InferenceRequest(
            request_id=f"req-{spec.index}",
            prompt=spec.prompt,
            max_tokens=spec.max_tokens,
            priority=spec.priority or 0,
        )
        clock.sent()
        async with contextlib.aclosing(self.server.handle_request(request)) as stream:
            async for response in stream:
                if response.finished:
                    clock.usage(response.generated_tokens)
                elif response.token:
                    clock.content()
