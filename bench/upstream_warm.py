"""What opening the next stream's connection ahead saves a request's first token.

``python -m bench.upstream_warm``: one ``llama-server`` (the tiny random model of
:mod:`rigs.llama`, 4 slots) and two of the worker's upstream adapters
(:class:`~worker.backends.openai.OpenAIUpstream`) in front of it: one declares the
engine ``llamacpp`` (it opens each stream's connection ahead, docs/backends.md
"Connections"), the other ``generic`` with the same slots (each stream connects
itself: llama.cpp's server closes a connection after every stream). Requests of 32
words and 16 tokens go one at a time, alternating between the two, each
:data:`GAP_S` after the previous one ended (a pipeline's turnaround: the client gets
the end, sends the next request, llmq hands it to the worker); prints the median
time from the adapter's call to its first token, and the median of the paired
differences, over :data:`PAIRS` pairs.
"""

from __future__ import annotations

import asyncio
import statistics
import time

import uvloop

from llmq.model.interface import GenerationRequest, Report
from rigs.llama import tiny_server
from worker.backends.engines import ENGINES
from worker.backends.openai import OpenAIUpstream

PAIRS = 300
GAP_S = 0.003
SLOTS = 4
WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta")


async def _first_token(upstream: OpenAIUpstream, n: int) -> float:
    """Milliseconds to the first token of a prompt no earlier request sent."""
    prompt = " ".join(WORDS[(n * 7 + i * (n % 5 + 1)) % len(WORDS)] for i in range(31))
    request = GenerationRequest(prompt=f"{n} {prompt}", max_tokens=16, seed=0, prompt_tokens=32)
    start, first = time.perf_counter(), None
    async for out in upstream.generate(request):
        if first is None and not isinstance(out, Report):
            first = time.perf_counter()
    assert first is not None, "no token"
    return (first - start) * 1000


async def _measure(url: str) -> dict[str, list[float]]:
    upstreams = {
        name: OpenAIUpstream(url, ENGINES[name], slots=SLOTS, capabilities=frozenset())
        for name in ("generic", "llamacpp")
    }
    times: dict[str, list[float]] = {name: [] for name in upstreams}
    try:
        for upstream in upstreams.values():
            await upstream.connect()
        for n in range(PAIRS):
            for i, (name, upstream) in enumerate(upstreams.items()):
                await asyncio.sleep(GAP_S)
                times[name].append(await _first_token(upstream, 2 * n + i))
    finally:
        for upstream in upstreams.values():
            await upstream.aclose()
    return times


def main() -> None:
    with tiny_server(SLOTS) as url:
        times = uvloop.run(_measure(url))  # as the worker runs
    for name, values in times.items():
        print(f"{name:8}: median time to the first token {statistics.median(values):.3f} ms")
    paired = [g - w for g, w in zip(times["generic"], times["llamacpp"], strict=True)]
    print(
        f"generic - llamacpp, median of {PAIRS} paired differences: "
        f"{statistics.median(paired):.3f} ms"
    )


if __name__ == "__main__":
    main()
