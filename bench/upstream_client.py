"""What reading an inference server's stream costs the client: httpx against aiohttp.

``python -m bench.upstream_client``: one ``llama-server`` (the tiny random model of
:mod:`rigs.llama`, 4 slots), 64-token completions streamed 1 and 4 at a time, 10
rounds each, by each client through llmq's SSE decoder, alternated, 3 repeats;
prints the median client CPU (``process_time``) per token and tokens per second.
The worker's upstream adapter reads with the cheaper one (docs/upstream-benchmark.md).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import AsyncIterable, Awaitable, Callable

import aiohttp
import httpx

from llmq.sse import DONE, frames
from rigs.llama import tiny_server

BODY = {
    "prompt": "hello world " * 16,
    "max_tokens": 64,
    "temperature": 0,
    "stream": True,
    "ignore_eos": True,
    "stream_options": {"include_usage": True},
}
ROUNDS = 10
REPEATS = 3


async def _events(chunks: AsyncIterable[bytes]) -> int:
    n = 0
    async for frame in frames(chunks):
        if frame.data.strip() == DONE:
            break
        json.loads(frame.data)
        n += 1
    return n


async def _measure(client: str, url: str, streams: int) -> tuple[float, float]:
    """Client CPU ms per token and tokens/s over ``ROUNDS`` rounds of ``streams``."""
    one: Callable[[], Awaitable[int]]
    if client == "httpx":
        hx = httpx.AsyncClient(base_url=url, timeout=30)

        async def one_httpx() -> int:
            async with hx.stream("POST", "/v1/completions", json=BODY) as response:
                return await _events(response.aiter_bytes())

        one, close = one_httpx, hx.aclose
    else:
        session = aiohttp.ClientSession()

        async def one_aiohttp() -> int:
            async with session.post(url + "/v1/completions", json=BODY) as response:
                return await _events(response.content.iter_any())

        one, close = one_aiohttp, session.close
    try:
        await one()  # connect, warm up
        cpu, wall, tokens = time.process_time(), time.perf_counter(), 0
        for _ in range(ROUNDS):
            tokens += sum(await asyncio.gather(*(one() for _ in range(streams))))
        return (time.process_time() - cpu) * 1000 / tokens, tokens / (time.perf_counter() - wall)
    finally:
        await close()


def main() -> None:
    runs: dict[tuple[str, int], list[tuple[float, float]]] = {}
    with tiny_server(slots=4) as url:
        for _ in range(REPEATS):
            for client in ("httpx", "aiohttp"):
                for streams in (1, 4):
                    runs.setdefault((client, streams), []).append(
                        asyncio.run(_measure(client, url, streams))
                    )
    for (client, streams), repeats in runs.items():
        cpu = statistics.median(r[0] for r in repeats)
        rate = statistics.median(r[1] for r in repeats)
        print(f"{client:8} {streams} streams: {cpu:.3f} ms client CPU/token, {rate:,.0f} tok/s")


if __name__ == "__main__":
    main()
