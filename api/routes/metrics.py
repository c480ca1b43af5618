"""The routes ``/metrics`` (for Prometheus) and ``/v1/metrics/summary`` (JSON).

Named by its path, like the other routes; the metric families, the tally and
the flush to Redis are :mod:`llmq.metrics`. Both routes serve cluster-wide
figures: they read what every process flushed to Redis, so they are the same on
any API replica, and at most about one flush interval (1 s) behind.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST
from redis.exceptions import MaxConnectionsError

from api.exposition import render, scrape
from api.state import State
from api.summary import cluster_summary, window_rates
from api.totals import read_totals
from llmq.connection import PoolExhausted
from llmq.outage import OUTAGE

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response)
async def prometheus_metrics(state: State) -> Response:
    """Counters and histograms of the whole cluster, plus queue and worker gauges; while
    Redis is away, only ``llmq_redis_up 0`` (a 200, so that Prometheus keeps the answer)."""
    try:
        data = await scrape(state.redis, state.settings.worker_ttl_seconds, state.accept_models)
    except (PoolExhausted, MaxConnectionsError):
        raise  # this process is busy, Redis is not away: the error boundary's 429
    except OUTAGE:
        data = None
    return Response(render(data), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/metrics/summary")
async def summary(state: State) -> dict[str, Any]:
    """Outcome counts, estimated latency percentiles and recent rates (see api.summary)."""
    return cluster_summary(await read_totals(state.redis), await window_rates(state.redis))
