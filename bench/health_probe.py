"""``python -m bench.health_probe URL SECONDS [INTERVAL]``: is the API alive under a burst?

Polls ``URL`` (the API's ``/healthz``) every ``INTERVAL`` seconds (default 0.05)
for ``SECONDS`` and prints one JSON line: probes sent, failures (no answer
within 5 s or a non-200 status) and the latency median, p99 and max in ms. It is
a separate process on purpose: a poller inside the load generator would measure
the load generator's own busy event loop, not the API's.
"""

from __future__ import annotations

import json
import sys
import time

import httpx

from bench.stats import describe_ms

PROBE_TIMEOUT = 5.0


def probe(url: str, seconds: float, interval: float) -> dict[str, object]:
    latencies: list[float] = []
    failures = 0
    end = time.monotonic() + seconds
    with httpx.Client(timeout=PROBE_TIMEOUT) as client:
        while time.monotonic() < end:
            began = time.perf_counter()
            try:
                ok = client.get(url).status_code == 200
            except httpx.HTTPError:
                ok = False
            latencies.append((time.perf_counter() - began) * 1000.0)
            failures += not ok
            time.sleep(max(0.0, interval - (time.perf_counter() - began)))
    stats = describe_ms(latencies)
    return {
        "probes": len(latencies),
        "failures": failures,
        "latency_ms_median": stats["median"],
        "latency_ms_p99": stats["p99"],
        "latency_ms_max": stats["max"],
    }


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print("usage: python -m bench.health_probe URL SECONDS [INTERVAL]", file=sys.stderr)
        return 2
    interval = float(argv[2]) if len(argv) == 3 else 0.05
    print(json.dumps(probe(argv[0], float(argv[1]), interval)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
