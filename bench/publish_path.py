"""Instructions of the publisher's command building per request per flush.

``python -m bench.publish_path CALLS`` calls :func:`llmq.protocol.streams.publish_calls`
``CALLS`` times on 30 requests of one ``tokens`` event each, as a worker's flush does
nearly once per token. It touches no Redis and no clock, so under
``valgrind --tool=callgrind`` its count is the same run after run, whatever else the
machine does: the difference of ``CALLS`` = 200 and 0, divided by 6,000, is the
instructions per request per flush (docs/benchmarks.md, "The per-token path").
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from llmq.protocol import streams
from llmq.schema import Event, Lifecycle, TokensEvent

REQUESTS = 30


@dataclass(frozen=True)
class _Writes:
    """One request's writes in a flush: one token event, nothing else."""

    attempt: int
    events: Sequence[Event]
    record: Mapping[str, str] = field(default_factory=dict)
    notes: Sequence[Lifecycle] = ()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("calls", type=int, help="how many times to build the flush's commands")
    args = parser.parse_args(argv)
    writes = {
        f"req-{i}": _Writes(attempt=1, events=[TokensEvent(index=5, tokens=[" fox"])])
        for i in range(REQUESTS)
    }
    for _ in range(args.calls):
        streams.publish_calls(
            "sha", writes, ttl=600, maxlen=1000, lifecycle_maxlen=10000, by_slot=False
        )


if __name__ == "__main__":
    main()
