"""Two systems' time to first token, measured request by request in turn.

The medians of separate runs differ from run to run by more than what llmq adds to a
first token: each run has servers of its own and its own moment on a shared machine
(on two cores, one direct run's median moved by a millisecond or two between
repeats). One request to each system in turn, from the same client, to servers
started together, gives pairs that share the machine's state; the median of their
differences leaves most of that noise out. The order alternates (A B, B A, ...) so
that neither system always follows the other. Each request's prompt is one no
earlier request sent (its own index in the workload), so no server answers it from
its prompt cache.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from typing import Any

from bench.stats import median
from loadgen import LoadConfig
from loadgen.client import HttpTarget
from loadgen.measurements import RequestFailed, StreamClock
from loadgen.workload import Workload

#: Pause between two requests: each starts on a pipeline that finished the last one.
GAP_S = 0.005


async def _ttft(target: HttpTarget, workload: Workload, index: int) -> float | None:
    """Milliseconds to the first content of request ``index``; None if it failed."""
    clock = StreamClock()
    try:
        await target.send(workload.spec(index), clock)
    except RequestFailed:
        return None
    return (clock.chunk_at[0] - clock.sent_at) * 1000 if clock.chunk_at else None


async def _alternate(urls: Mapping[str, str], config: LoadConfig, pairs: int) -> dict[str, Any]:
    names = list(urls)
    targets = {n: HttpTarget(dataclasses.replace(config, base_url=u)) for n, u in urls.items()}
    workload = Workload(config)
    ttft: dict[str, list[float]] = {n: [] for n in names}
    failed = 0
    try:
        for target in targets.values():
            await target.prepare()
        for pair in range(pairs):
            order = names if pair % 2 == 0 else names[::-1]
            got: dict[str, float | None] = {}
            for i, name in enumerate(order):
                await asyncio.sleep(GAP_S)
                got[name] = await _ttft(targets[name], workload, len(names) * pair + i)
            if any(v is None for v in got.values()):
                failed += 1
                continue
            for name, value in got.items():
                assert value is not None
                ttft[name].append(value)
    finally:
        for target in targets.values():
            await target.aclose()
    return {"ttft_ms": ttft, "failed": failed}


def paired_ttft(urls: Mapping[str, str], config: LoadConfig, pairs: int) -> dict[str, Any]:
    """``pairs`` rounds of one request to each of ``urls`` (two systems, by name), one
    at a time; per system its TTFTs (ms) and their median, and the median of the
    differences second minus first, over the pairs where both requests succeeded."""
    out = asyncio.run(_alternate(urls, config, pairs))
    first, second = (out["ttft_ms"][n] for n in urls)
    out["ttft_ms_median"] = {n: median(v) for n, v in out["ttft_ms"].items()}
    differences = [b - a for a, b in zip(first, second, strict=True)]
    out["difference_ms_median"] = median(differences)
    out["pairs"] = len(differences)
    return out
