"""Where a request's time goes inside llmq, read back from Redis after a run.

The client sees one TTFT; the pipeline leaves timestamps behind that split it:
the request record (``llmq.protocol.keys.request(id)``: ``created_at`` when the API accepted it,
``started_at`` when a worker started it) and the request's stream, whose entry
ids carry the millisecond at which the worker wrote each event. So, per request:

* ``accept_to_start_ms``: API accept -> worker start (the queue hop);
* ``start_to_first_token_ms``: worker start -> first ``tokens`` event written
  (the model's prefill and first token, plus the publisher);

and whatever TTFT is left (HTTP in, the relay's read, SSE out, the client's
parse) is the residual. It reads only documented keys and fields; if they
change, it reports nothing rather than failing the benchmark.
"""

from __future__ import annotations

import contextlib
from typing import Any

import redis

from bench.stats import median
from llmq.protocol import keys


def _first_tokens_ms(client: redis.Redis, rid: str) -> float | None:
    entries: Any = client.xrange(keys.stream(rid), count=8)
    for entry_id, fields in entries:
        if fields.get(b"type") == b"tokens":
            return float(entry_id.split(b"-")[0])
    return None


def pipeline_breakdown(redis_url: str, since: float) -> dict[str, float | None]:
    """Medians over the requests the API accepted at or after Unix time ``since``."""
    accept_to_start: list[float] = []
    start_to_token: list[float] = []
    client = redis.Redis.from_url(redis_url)
    try:
        with contextlib.suppress(redis.RedisError, ValueError, KeyError):
            for key in client.scan_iter(match=keys.REQUESTS_GLOB, count=500):
                record: Any = client.hmget(key, ["id", "created_at", "started_at"])
                rid, created, started = record
                if rid is None or created is None or started is None:
                    continue
                created_s, started_s = float(created), float(started)
                if created_s < since:
                    continue
                accept_to_start.append((started_s - created_s) * 1000.0)
                first = _first_tokens_ms(client, rid.decode())
                if first is not None:
                    start_to_token.append(first - started_s * 1000.0)
    finally:
        client.close()
    return {
        "requests": float(len(accept_to_start)),
        "accept_to_start_ms": median(accept_to_start),
        "start_to_first_token_ms": median(start_to_token),
    }
