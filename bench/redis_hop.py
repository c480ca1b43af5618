"""The floor of any hand-off through Redis: one PUBLISH to an idle subscriber.

``python -m bench.redis_hop REDIS_URL`` subscribes to :data:`CHANNEL` on uvloop,
as llmq's worker listens for its hand-offs, and for each message (the sender's
``time.time()``) pushes ``received - sent`` (seconds) onto :data:`WAITS_KEY`. The
pickup benchmark publishes with the same spacing of arrivals as its llmq and arq
runs, so the figure is what the hop alone costs on the machine: the sender's
command reaching Redis, Redis's write to the subscriber, and both processes waking
from idle (on a virtual machine, waking an idle core is most of it). llmq's
hand-off is that hop plus its own work on either side.
"""

from __future__ import annotations

import sys
import time

import uvloop
from redis.asyncio import Redis

CHANNEL = "bench:hop"
WAITS_KEY = "bench:hop:waits"


async def listen(url: str) -> None:
    redis = Redis.from_url(url)
    async with redis.pubsub(ignore_subscribe_messages=True) as pubsub:
        await pubsub.subscribe(CHANNEL)
        while True:
            message = await pubsub.get_message(timeout=1.0)
            if message is None or message.get("type") != "message":
                continue
            waited = time.time() - float(message["data"])
            await redis.rpush(WAITS_KEY, repr(waited))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m bench.redis_hop REDIS_URL", file=sys.stderr)
        return 2
    uvloop.run(listen(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
