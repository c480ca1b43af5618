"""What a pool's check of the connection it hands out costs the client, per command.

``python -m bench.pool_check [--commands N] [--repeats N]``: one embedded Redis and
two clients on llmq's pool (:func:`llmq.connection.make_pool`), one with
redis-py's own hiredis parser, whose check reads the socket with a zero timeout,
and one with :class:`~llmq.connection.PooledReplyParser`, whose check reads
nothing. Each repeat sends ``N`` commands one at a time through each, in turn (a
``GET``, and a pipeline of two ``EVALSHA`` as the API's enqueue sends); prints the
medians of the client's CPU (``process_time``) and wall time per command.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Awaitable, Callable, Sequence

import uvloop
from redis.asyncio import Redis

from bench.stats import median
from llmq.connection import make_pool
from llmq.embedded import EmbeddedRedis
from llmq.settings import CommonSettings

SCRIPT = "return redis.call('GET', KEYS[1])"
KINDS = ("GET", "pipeline of 2 EVALSHA")


def _client(url: str, *, reading_check: bool) -> Redis:
    pool = make_pool(CommonSettings(redis_url=url))
    if reading_check:  # redis-py's own parser (hiredis), as without llmq's
        del pool.connection_kwargs["parser_class"]
    return Redis(connection_pool=pool)


async def _per_command(send: Callable[[], Awaitable[object]], n: int) -> tuple[float, float]:
    """Microseconds of client CPU and of wall time per command, over ``n`` commands."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(n):
        await send()
    return (time.process_time() - cpu) / n * 1e6, (time.perf_counter() - wall) / n * 1e6


async def _measure(url: str, commands: int, repeats: int) -> dict[str, list[tuple[float, float]]]:
    clients = {
        "reading check": _client(url, reading_check=True),
        "no-read check": _client(url, reading_check=False),
    }
    out: dict[str, list[tuple[float, float]]] = {}
    try:
        sha = await clients["no-read check"].script_load(SCRIPT)
        for name, client in clients.items():
            for kind in KINDS:
                await _per_command(_sender(client, kind, sha), 100)  # connect, warm up
                out[f"{name}, {kind}"] = []
        for _ in range(repeats):
            for name, client in clients.items():
                for kind in KINDS:
                    send = _sender(client, kind, sha)
                    out[f"{name}, {kind}"].append(await _per_command(send, commands))
    finally:
        for client in clients.values():
            await client.aclose(close_connection_pool=True)
    return out


def _sender(client: Redis, kind: str, sha: str) -> Callable[[], Awaitable[object]]:
    if kind == "GET":
        return lambda: client.get("k")

    async def pipeline() -> object:
        pipe = client.pipeline(transaction=False)
        pipe.evalsha(sha, 1, "k")
        pipe.evalsha(sha, 1, "k")
        return await pipe.execute()

    return pipeline


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.pool_check", description=__doc__)
    parser.add_argument("--commands", type=int, default=2000, help="per client, per repeat")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)
    with EmbeddedRedis() as server:
        runs = uvloop.run(_measure(server.url, args.commands, args.repeats))
    print(f"{args.commands} commands per client per repeat, {args.repeats} repeats, medians:")
    for name, values in runs.items():
        cpu, wall = median([v[0] for v in values]), median([v[1] for v in values])
        print(f"  {name:<40} client CPU {cpu:6.1f} us   wall {wall:6.1f} us")


if __name__ == "__main__":
    main()
