"""Systems' time to first token, measured request by request in turn.

The medians of separate runs differ from run to run by more than what llmq adds to a
first token: each run has servers of its own and its own moment on a shared machine
(on two cores, one direct run's median moved by a millisecond or two between
repeats). One request to each system in turn, from the same client, to servers
started together, gives rounds that share the machine's state; the median of their
differences leaves most of that noise out. The order alternates (A B C, C B A, ...)
so that no system always follows another. Each request's prompt is one no
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


async def _alternate(urls: Mapping[str, str], config: LoadConfig, rounds: int) -> dict[str, Any]:
    names = list(urls)
    targets = {n: HttpTarget(dataclasses.replace(config, base_url=u)) for n, u in urls.items()}
    workload = Workload(config)
    ttft: dict[str, list[float]] = {n: [] for n in names}
    failed = 0
    try:
        for target in targets.values():
            await target.prepare()
        for round_ in range(rounds):
            order = names if round_ % 2 == 0 else names[::-1]
            got: dict[str, float | None] = {}
            for i, name in enumerate(order):
                await asyncio.sleep(GAP_S)
                got[name] = await _ttft(targets[name], workload, len(names) * round_ + i)
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


def paired_ttft(urls: Mapping[str, str], config: LoadConfig, rounds: int) -> dict[str, Any]:
    """``rounds`` times one request to each of ``urls`` (systems by name), one at a
    time; per system its TTFTs (ms) and their median, and for every two systems the
    median of the differences later minus earlier in ``urls`` (keyed ``"later -
    earlier"``), over the rounds where every request succeeded."""
    out = asyncio.run(_alternate(urls, config, rounds))
    ttft: dict[str, list[float]] = out["ttft_ms"]
    out["ttft_ms_median"] = {n: median(v) for n, v in ttft.items()}
    names = list(urls)
    out["difference_ms_median"] = {
        difference_key(later, earlier): median(
            [b - a for a, b in zip(ttft[earlier], ttft[later], strict=True)]
        )
        for i, earlier in enumerate(names)
        for later in names[i + 1 :]
    }
    out["rounds"] = len(ttft[names[0]])
    return out


def difference_key(later: str, earlier: str) -> str:
    """The key of ``later``'s paired difference from ``earlier`` in :func:`paired_ttft`."""
    return f"{later} - {earlier}"
