"""CPU per request of a worker's own queue calls, in one process: claim, finish, yield.

``python -m bench.queue_path`` admits ``--requests`` requests of one tenant under fair
share (``LLMQ_FAIRNESS=vtc``, the default), then, as a worker does for each, claims it
(:meth:`Queue.claim`), calls :meth:`Queue.fair_yield` ``--yields`` times with it as
the candidate (what a full worker's wake costs when it asks), and finishes it
(:meth:`Queue.finish`, with the tokens its run used where the tree takes them).
Redis is a private ``redis-server``; only this process's work is measured. With
``--policy`` the queue holds the pool policy as a worker does
(:class:`llmq.policy.live.LivePolicy`): each claim runs under its version, which
the claim script checks against the model's floor.

Run under ``valgrind --tool=callgrind``, the difference of two sizes is the
instructions per request of those calls, start-up and imports cancelled
(docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import sys
import time

from redis.asyncio import Redis

from llmq.embedded import EmbeddedRedis
from llmq.protocol.queue import Enqueue, Queue
from llmq.schema import JobPayload, SamplingParams

MODEL = "mock"
PROMPT_TOKENS, MAX_TOKENS = 100, 50


def _payload(request_id: str, tenant: str | None) -> JobPayload:
    now = time.time()
    return JobPayload(
        request_id=request_id,
        model=MODEL,
        prompt="hello",
        prompt_tokens=PROMPT_TOKENS,
        params=SamplingParams(max_tokens=MAX_TOKENS),
        enqueued_at=now,
        queue_deadline=now + 600,
        generation_timeout=60.0,
        tenant=tenant,
    )


async def _run(url: str, requests: int, yields: int, tenant: str | None, policy: bool) -> None:
    redis = Redis.from_url(url, decode_responses=True)
    queue = Queue(redis, stream_maxlen=1000, ttl_seconds=600, fairness="vtc")
    if policy:  # imported here: the trees from before the pool policy have no module
        from llmq.policy.live import LivePolicy

        live = LivePolicy(redis, live_ms=60_000, who="bench")
        await live.refresh()
        queue.policy = live
    takes_used = "used" in inspect.signature(Queue.finish).parameters
    calls = [Enqueue.of(_payload(f"q{i}", tenant), priority_step_ms=1000) for i in range(requests)]
    await queue.admit(calls, 10**6)
    for _ in range(requests):
        claim = await queue.claim(
            MODEL,
            lease_ms=60_000,
            in_progress_ms=60_000,
            budget_left=None,
            idle=True,
            worker_id="bench",
            free_slots=1,
            capacity=1,
        )
        assert claim.request_id is not None
        for _ in range(yields):
            await queue.fair_yield(MODEL, "bench", [claim.request_id])
        if takes_used:
            used = PROMPT_TOKENS + MAX_TOKENS
            await queue.finish(MODEL, claim.request_id, claim.attempt, used=used)  # type: ignore[call-arg,unused-ignore]
        else:
            await queue.finish(MODEL, claim.request_id, claim.attempt)
    await redis.flushall()
    await redis.aclose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.queue_path", description=__doc__)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--yields", type=int, default=0, help="fair_yield calls per request")
    parser.add_argument("--tenant", default="acme", help="the requests' tenant ('': none)")
    parser.add_argument("--policy", action="store_true", help="claims under the pool policy")
    args = parser.parse_args(argv)
    with EmbeddedRedis() as server:
        tenant = args.tenant or None
        asyncio.run(_run(server.url, 20, args.yields, tenant, args.policy))  # warm: scripts
        started = time.process_time()
        asyncio.run(_run(server.url, args.requests, args.yields, tenant, args.policy))
        cpu = time.process_time() - started
    each = cpu * 1e6 / args.requests
    print(f"{args.requests} requests, {args.yields} yields each: {each:.0f} us of CPU each")
    return 0


if __name__ == "__main__":
    sys.exit(main())
