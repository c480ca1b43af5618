"""The cyclic garbage collector, tuned for the processes that stream tokens.

The API and the workers make almost no cyclic garbage while streaming, only
short-lived objects that reference counting frees, yet with CPython's default
thresholds the collector walks them dozens of times a second, and every full
collection stops every stream of the process at once, right in the ITL p99.
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger(__name__)

#: Net new objects between two young collections (CPython's default is 700).
YOUNG_COLLECTION_THRESHOLD = 50_000


def tune_garbage_collector() -> int:
    """Keep the collector from costing a streaming process its CPU and its ITL tail;
    returns how many objects were frozen.

    Every token a streaming process relays or generates allocates a few objects, so
    with CPython's default threshold (a young collection per 700 net new objects)
    the collector runs many times a second, and each older-generation or full
    collection walks every live object, the whole imported code base included,
    while every stream of the process waits: its cost is CPU taken from the
    streams and pauses in their inter-token latency, growing with the load (what
    this tuning saved is in CHANGELOG.md, a process's CPU per token now in
    docs/benchmarks.md). So:

    * what the process built to start (the app or the worker, every imported module:
      tens of thousands of objects that live as long as the process) is frozen
      (``gc.freeze``), so that no collection walks it again;
    * a young collection waits for 50,000 net new objects instead of 700: at a
      steady load that is almost never, and the garbage it leaves for later is
      bounded by the same number.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD)
    frozen = gc.get_freeze_count()
    log.info(
        "garbage collector: %d objects frozen, a young collection every %d net new objects",
        frozen,
        YOUNG_COLLECTION_THRESHOLD,
    )
    return frozen
