"""Cluster-wide metrics: families, in-process aggregation, and deltas flushed to Redis.

Every process (API or worker) counts into its own :class:`Tally`: an
observation is one dict increment, with no I/O, so a per-token observation costs
next to nothing. :func:`flush_forever` moves the accumulated deltas to Redis every
``FLUSH_SECONDS`` with ``HINCRBYFLOAT`` in one script call (``metrics_flush.lua``, one
hash per family, every key in the metrics slot of :mod:`llmq.protocol.keys`), and
a last :func:`flush` runs on clean shutdown. Because the totals live in Redis, what
a process counted survives its restart, its removal or a ``SIGKILL`` (less at most
the last second), and any API replica can serve ``/metrics`` for the whole cluster.

Hash fields are bounded: label values are model names and finished reasons, and
histogram fields are one per bucket bound plus ``sum`` and ``count``. A field is
the JSON list ``[kind, *label_values]`` (``kind``: a bucket bound such as ``"0.5"``
or ``"+Inf"``, ``"sum"``, ``"count"``, or ``""`` for a counter). Bucket counts are
stored per bucket (not cumulative); readers accumulate them.

Counter deltas are also added, summed over labels, to a per-second hash
(:func:`llmq.protocol.keys.metrics_second`, expiring after ``WINDOW_KEEP_SECONDS``) so that
rates over the last minute can be computed without keeping history elsewhere.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from bisect import bisect_left
from collections import defaultdict
from dataclasses import dataclass

from redis.asyncio import Redis

from llmq.protocol import keys
from llmq.protocol.scripts import scripts_for
from llmq.protocol.slots import MetricsFlush
from llmq.tasks import run_periodically

log = logging.getLogger(__name__)

FLUSH_SECONDS = 1.0
#: How long a flush's marker says it was applied (a failed flush is checked at the next).
FLUSH_MARKER_SECONDS = 600
#: Per-second totals are kept this long (the rate window is at most this).
WINDOW_KEEP_SECONDS = 120

#: vLLM's TTFT buckets (seconds).
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
#: Between two tokens / per output token (seconds).
TOKEN_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
    0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
#: Whole-request spans: e2e, queue, prefill, decode (seconds).
SPAN_BUCKETS = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 5.0,
    7.5, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
TOKEN_COUNT_BUCKETS = (
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0,
    10000.0, 20000.0, 50000.0, 100000.0,
)  # fmt: skip

OUTCOMES = ("stop", "length", "cancelled", "timeout", "rejected", "error")


@dataclass(frozen=True)
class Histogram:
    name: str
    help: str
    buckets: tuple[float, ...]
    labels: tuple[str, ...] = ("model",)

    @property
    def bounds(self) -> tuple[str, ...]:
        """The bucket bounds as stored (and exposed): ``"0.5"`` ... ``"+Inf"``."""
        return (*(repr(b) for b in self.buckets), "+Inf")


@dataclass(frozen=True)
class Counter:
    """Exposed with the ``_total`` suffix (``name`` is the family name, without it)."""

    name: str
    help: str
    labels: tuple[str, ...] = ("model",)


TTFT = Histogram(
    "llmq_time_to_first_token_seconds",
    "Request arrival at the API -> first token relayed by the API.",
    TTFT_BUCKETS,
)
E2E = Histogram(
    "llmq_e2e_request_latency_seconds",
    "Request arrival at the API -> last event relayed by the API.",
    SPAN_BUCKETS,
)
ITL = Histogram(
    "llmq_inter_token_latency_seconds",
    "Time between two consecutive tokens, as the worker produced them.",
    TOKEN_BUCKETS,
)
TPOT = Histogram(
    "llmq_time_per_output_token_seconds",
    "Decode time divided by (generated tokens - 1), per request.",
    TOKEN_BUCKETS,
)
QUEUE_TIME = Histogram(
    "llmq_request_queue_time_seconds",
    "Accepted by the API -> started by a worker.",
    SPAN_BUCKETS,
)
PREFILL_TIME = Histogram(
    "llmq_request_prefill_time_seconds", "Started by a worker -> first token.", SPAN_BUCKETS
)
DECODE_TIME = Histogram(
    "llmq_request_decode_time_seconds", "First token -> last token.", SPAN_BUCKETS
)
PROMPT_TOKENS_HIST = Histogram(
    "llmq_request_prompt_tokens", "Prompt tokens per finished request.", TOKEN_COUNT_BUCKETS
)
GENERATION_TOKENS_HIST = Histogram(
    "llmq_request_generation_tokens", "Generated tokens per finished request.", TOKEN_COUNT_BUCKETS
)
REQUESTS = Counter(
    "llmq_requests",
    "Requests by outcome: stop, length, cancelled, timeout, rejected (429), error.",
    ("model", "finished_reason"),
)
PROMPT_TOKENS = Counter("llmq_prompt_tokens", "Prompt tokens of requests run by workers.")
GENERATION_TOKENS = Counter("llmq_generation_tokens", "Tokens generated by workers.")
PREFIX_CACHE_QUERIES = Counter(
    "llmq_prefix_cache_queries",
    "Prompt tokens looked up in the workers' prefix caches (vLLM's prefix_cache_queries).",
)
PREFIX_CACHE_HITS = Counter(
    "llmq_prefix_cache_hits",
    "Prompt tokens found in the workers' prefix caches, not computed again.",
)
LEASE_LOST_TOKENS = Counter(
    "llmq_lease_lost_tokens",
    "Tokens generated by runs that lost their lease, after their last successful renewal.",
)
AUTOSCALER_ACTIONS = Counter(
    "llmq_autoscaler_actions",
    "Scale actions of the autoscaler by direction (up, down) and reason.",
    ("model", "direction", "reason"),
)
BATCH_LINES = Counter(
    "llmq_batch_lines",
    "Batch lines by outcome: completed, failed (each custom_id once), yielded (a line "
    "that gave its slot to a live request).",
    ("model", "outcome"),
)
BATCHES = Counter(
    "llmq_batches",
    "Batches ended, by status: completed, expired, cancelled.",
    ("model", "status"),
)
FAIR_YIELDS = Counter(
    "llmq_fair_yields",
    "Live requests that gave their slot to another tenant's (LLMQ_FAIRNESS=vtc), to be "
    "resumed later.",
)
WORKER_STARTS = Counter(
    "llmq_worker_starts",
    "Worker processes started (counted by each at its start; restarts included).",
)

TENANT_REQUESTS = Counter(
    "llmq_tenant_requests",
    "Requests at admission by tenant and outcome: accepted, rate_limited (its quota), "
    "shed (expected wait) (tenants beyond the first 20 by name: tenant=other).",
    ("tenant", "outcome"),
)
TENANT_TOKENS = Counter(
    "llmq_tenant_tokens",
    "Prompt + completion tokens of the tenant's requests that ended (tenant as above).",
    ("tenant",),
)
HTTP_RESPONSES = Counter(
    "llmq_http_responses",
    "HTTP responses of the API by status class (2xx, 4xx, 5xx, ...), counted once per "
    "response at its start (a stream once); probes and scrapes are not counted.",
    ("code_class",),
)

HISTOGRAMS: tuple[Histogram, ...] = (
    TTFT,
    E2E,
    ITL,
    TPOT,
    QUEUE_TIME,
    PREFILL_TIME,
    DECODE_TIME,
    PROMPT_TOKENS_HIST,
    GENERATION_TOKENS_HIST,
)
COUNTERS: tuple[Counter, ...] = (
    REQUESTS,
    PROMPT_TOKENS,
    GENERATION_TOKENS,
    PREFIX_CACHE_QUERIES,
    PREFIX_CACHE_HITS,
    LEASE_LOST_TOKENS,
    AUTOSCALER_ACTIONS,
    BATCH_LINES,
    BATCHES,
    FAIR_YIELDS,
    WORKER_STARTS,
    TENANT_REQUESTS,
    TENANT_TOKENS,
    HTTP_RESPONSES,
)
Family = Histogram | Counter
_ALL: tuple[Family, ...] = (*HISTOGRAMS, *COUNTERS)
FAMILIES: dict[str, Family] = {f.name: f for f in _ALL}

#: (family name, kind, label values) -> delta since the last flush.
_Key = tuple[str, str, tuple[str, ...]]


def field(kind: str, labels: tuple[str, ...]) -> str:
    return json.dumps([kind, *labels])


def parse_field(raw: str) -> tuple[str, tuple[str, ...]] | None:
    """``(kind, label values)`` of a stored hash field, or None if it is foreign."""
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        return None
    return value[0], tuple(value[1:])


class Tally:
    """One process's not-yet-flushed deltas; every method is synchronous and I/O-free."""

    def __init__(self) -> None:
        self._deltas: defaultdict[_Key, float] = defaultdict(float)
        self._bounds = {h.name: h.bounds for h in HISTOGRAMS}
        self._id = secrets.token_hex(6)
        self._flushes = 0
        #: A failed flush that may have been applied all the same: its marker, deltas.
        self._unsure: tuple[str, dict[_Key, float]] | None = None

    def observe(self, family: Histogram, value: float, *labels: str) -> None:
        bound = self._bounds[family.name][bisect_left(family.buckets, value)]
        d = self._deltas
        d[(family.name, bound, labels)] += 1
        d[(family.name, "sum", labels)] += value
        d[(family.name, "count", labels)] += 1

    def inc(self, family: Counter, *labels: str, amount: float = 1) -> None:
        self._deltas[(family.name, "", labels)] += amount

    def take(self) -> dict[_Key, float]:
        """The pending deltas, which the caller now owns (the tally starts afresh)."""
        taken, self._deltas = self._deltas, defaultdict(float)
        return dict(taken)

    def give_back(self, deltas: dict[_Key, float]) -> None:
        """Re-add deltas whose flush failed, so that they go out with the next one."""
        for key, value in deltas.items():
            self._deltas[key] += value

    async def flush(self, redis: Redis) -> None:
        """Write the pending deltas to Redis in one script call; on failure keep them.

        A failure does not say whether the call was applied: a read that timed
        out (Redis stalled) or a connection cut after the send may leave it applied,
        and sending its deltas again would count them twice. So each flush also sets
        a marker, and the deltas of a failed one go out again only once the marker is
        found missing. The check runs on a new connection after the failure; Redis
        serves it only after what the old connection had delivered.
        """
        if self._unsure is not None:
            marker, unsure = self._unsure
            applied = await redis.exists(marker)  # raises while Redis is away
            self._unsure = None
            if not applied:
                self.give_back(unsure)
        deltas = self.take()
        if not deltas:
            return
        self._flushes += 1
        marker = keys.metrics_flush(self._id, self._flushes)
        second = int(time.time())
        per_second: defaultdict[str, float] = defaultdict(float)
        per_family: defaultdict[str, list[str | float]] = defaultdict(list)
        for (name, kind, labels), value in deltas.items():
            per_family[name] += (field(kind, labels), value)
            if kind == "":
                per_second[name] += value
        deltas_: list[str | float] = []
        for name, value in per_second.items():
            deltas_ += (name, value)
        for pairs in per_family.values():
            deltas_ += (len(pairs) // 2, *pairs)
        flush = MetricsFlush(
            marker_key=marker,
            window_key=keys.metrics_second(second),
            marker_ttl=FLUSH_MARKER_SECONDS,
            window_ttl=WINDOW_KEEP_SECONDS,
            n_window=len(per_second),
            families=[keys.metric(name) for name in per_family],
            deltas=deltas_,
        )
        try:
            await flush.run(scripts_for(redis))
        except Exception:
            # Not on cancellation: the call may have been applied, and counting a
            # second twice is worse than missing it.
            self._unsure = (marker, deltas)
            raise


async def flush_forever(tally: Tally, redis: Redis, interval: float = FLUSH_SECONDS) -> None:
    """Flush every ``interval`` seconds until cancelled; a failed flush keeps its deltas
    for the next one."""
    await run_periodically(lambda: tally.flush(redis), interval, what="metrics flush", logger=log)


async def final_flush(tally: Tally, redis: Redis, timeout: float = 2.0) -> None:
    """The shutdown flush, after the flusher task stopped and before Redis is closed.

    Best effort: if Redis is away at shutdown, the last second's deltas are lost.
    """
    try:
        async with asyncio.timeout(timeout):
            await tally.flush(redis)
    except Exception as exc:
        log.warning("final metrics flush failed: %s", exc)
