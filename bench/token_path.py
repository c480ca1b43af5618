"""CPU per token of the per-token path, in one process: worker runners to the API's relay.

``python -m bench.token_path`` runs what the capacity scenario's llmq carries per
token, without HTTP, arq or a load generator: ``--workers`` worker runners
(:class:`worker.runner.RequestRunner`, each with its mock model and stream publisher)
run ``--streams`` requests of ``--tokens`` tokens at once at the mock's pace, and
one stream relay (:class:`api.streams.relay.StreamRelay`) reads them back for their
subscribers, which take the tokens as a response does (:class:`api.streams.follow.TokenCursor`).
Redis is a private ``redis-server``.

CPU time is what it reports, not latency: this process's (``time.process_time``)
and Redis's (``INFO cpu``), each per delivered token, median over ``--repeats``
runs. On a machine shared with other work CPU time moves far less than wall-clock
figures. ``--profile FILE`` runs the last repeat under cProfile and writes its stats
(read them with ``python -m pstats``), and prints the functions with the most own
time, with their calls per token: what appears per token, and what it costs.

Tracing is set up from the standard ``OTEL_*`` variables, as a worker does
(:mod:`llmq.tracing`; off unless they name an exporter): each run then makes its
``llmq.queue_wait`` and ``llmq.run`` spans, in a trace of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import pstats
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any

import uvloop
from redis.asyncio import Redis

from api.streams.follow import TokenCursor
from api.streams.relay import StreamRelay
from bench.sysinfo import redis_cpu_seconds
from llmq.embedded import EmbeddedRedis
from llmq.protocol import keys
from llmq.schema import JobPayload, SamplingParams, TokensEvent, is_terminal
from worker.publisher import StreamPublisher
from worker.runner import RequestRunner

try:
    from llmq.tracing import traced
except ImportError:  # a tree from before tracing

    def traced(service: str) -> contextlib.AbstractContextManager[bool]:  # type: ignore[misc]
        return contextlib.nullcontext(False)


try:
    from worker.mock import MockBackend as Mock
except ImportError:  # an older tree, compared with this one
    from worker.mock import MockModel as Mock  # type: ignore[attr-defined,no-redef]


@dataclass(frozen=True)
class Sizes:
    streams: int = 150
    tokens: int = 150
    workers: int = 2
    tokens_per_second: float = 50.0
    prompt_tokens: int = 100


def _payload(s: Sizes, request_id: str) -> JobPayload:
    now = time.time()
    return JobPayload(
        request_id=request_id,
        model="mock",
        prompt="hello " * s.prompt_tokens,
        prompt_tokens=s.prompt_tokens,
        params=SamplingParams(max_tokens=s.tokens, ignore_eos=True),
        enqueued_at=now,
        queue_deadline=now + 60,
        generation_timeout=60.0,
    )


async def _read(relay: StreamRelay, request_id: str) -> int:
    """What a response does with a stream: its tokens once each, until the terminal event."""
    cursor = TokenCursor()
    async with relay.subscription(keys.stream(request_id)) as sub:
        while True:
            for _, event in await sub.batch(5.0):
                if type(event) is TokensEvent:
                    cursor.take(event)
                elif is_terminal(event):
                    return cursor.next_index


async def _once(url: str, s: Sizes) -> tuple[int, float, float]:
    """One run: tokens delivered, this process's CPU seconds, wall seconds."""
    redis = Redis.from_url(url, decode_responses=True)
    # As the API's: a connection of its own, with a timeout longer than its block.
    relay_redis = Redis.from_url(url, decode_responses=True, socket_timeout=6.0)
    relay = StreamRelay(relay_redis, f"bench:control:{uuid.uuid4().hex}", block_ms=1000)
    await relay.start()
    runners = []
    for w in range(s.workers):
        publisher = StreamPublisher(redis, maxlen=10_000, ttl_seconds=600, max_event_tokens=64)
        publisher.start()
        backend = Mock(tokens_per_second=s.tokens_per_second, prefill_seconds_per_token=0.0)
        runners.append(RequestRunner(f"bench-{w}", backend, publisher, model="mock"))
    ids = [f"bench-{uuid.uuid4().hex}" for _ in range(s.streams)]
    # Subscribed before the runs start, as a response is before its request is queued.
    readers = [asyncio.create_task(_read(relay, rid)) for rid in ids]
    await asyncio.sleep(0.2)
    cpu, wall = time.process_time(), time.monotonic()
    runs = [runners[i % s.workers].run(_payload(s, rid), 1) for i, rid in enumerate(ids)]
    await asyncio.gather(*runs)
    delivered = sum(await asyncio.gather(*readers))
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    for runner in runners:
        await runner.publisher.stop()
    await relay.stop()
    await redis.flushall()
    await redis.aclose()
    await relay_redis.aclose()
    return delivered, cpu, wall


def _measure(url: str, s: Sizes) -> dict[str, float]:
    before = redis_cpu_seconds(url)
    delivered, cpu, wall = uvloop.run(_once(url, s))
    redis_cpu = redis_cpu_seconds(url) - before
    if delivered != s.streams * s.tokens:
        raise RuntimeError(f"delivered {delivered} tokens of {s.streams * s.tokens}")
    return {
        "process_us": cpu * 1e6 / delivered,
        "redis_us": redis_cpu * 1e6 / delivered,
        "wall_s": wall,
    }


def _profile_table(stats: pstats.Stats, tokens: int, top: int) -> str:
    """The ``top`` functions by own time: calls, own and cumulative microseconds per token."""
    rows = sorted(
        stats.stats.items(),  # type: ignore[attr-defined]
        key=lambda kv: kv[1][2],
        reverse=True,
    )[:top]
    lines = [f"{'calls/token':>11} {'own us/token':>12} {'cum us/token':>12}  function"]
    for (path, line, name), (_, calls, own, cum, _) in rows:
        where = "/".join(path.rsplit("/", 2)[-2:])
        lines.append(
            f"{calls / tokens:11.3f} {own * 1e6 / tokens:12.2f} {cum * 1e6 / tokens:12.2f}  "
            f"{name} ({where}:{line})"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.token_path", description=__doc__)
    parser.add_argument("--streams", type=int, default=Sizes.streams)
    parser.add_argument("--tokens", type=int, default=Sizes.tokens)
    parser.add_argument("--workers", type=int, default=Sizes.workers)
    parser.add_argument("--tokens-per-second", type=float, default=Sizes.tokens_per_second)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--redis-url", help="an existing Redis (default: a private one)")
    parser.add_argument("--profile", help="run the last repeat under cProfile; stats to FILE")
    parser.add_argument("--top", type=int, default=30, help="rows of the profile's table")
    args = parser.parse_args(argv)
    s = Sizes(args.streams, args.tokens, args.workers, args.tokens_per_second)
    server = None if args.redis_url else EmbeddedRedis()
    if server is not None:
        server.start()
    url = args.redis_url or (server.url if server is not None else "")
    try:
        with traced("llmq-worker"):
            _report(url, s, args)
    finally:
        if server is not None:
            server.stop()
    return 0


def _report(url: str, s: Sizes, args: argparse.Namespace) -> None:
    """The warm-up, the measured repeats and their line; the profile if asked."""
    _measure(url, Sizes(20, 20, s.workers, s.tokens_per_second))  # warm: imports, scripts
    runs = [_measure(url, s) for _ in range(args.repeats)]
    out: dict[str, Any] = {
        k: statistics.median(r[k] for r in runs) for k in ("process_us", "redis_us", "wall_s")
    }
    print(
        f"{s.streams} streams x {s.tokens} tokens at {s.tokens_per_second:g} tok/s, "
        f"{s.workers} workers, median of {len(runs)}: "
        f"process {out['process_us']:.2f} us/token, Redis {out['redis_us']:.2f} us/token "
        f"(runs: {', '.join(format(r['process_us'], '.2f') for r in runs)}; "
        f"wall {out['wall_s']:.2f} s)"
    )
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        _measure(url, s)
        profiler.disable()
        profiler.dump_stats(args.profile)
        print(_profile_table(pstats.Stats(profiler), s.streams * s.tokens, args.top))


if __name__ == "__main__":
    sys.exit(main())
