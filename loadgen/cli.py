"""``llmq loadgen``: the command-line front of :func:`loadgen.runner.run_load`.

The host CLI builds a parser, calls :func:`add_arguments`, parses, and calls
:func:`main`. Flags follow ``vllm bench serve`` where one exists. Exit codes:
0 when at least one request succeeded, 1 when none did, 2 for bad settings,
130 when interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from typing import TypeVar

from loadgen.config import (
    LoadConfig,
    parse_goodput,
    parse_pair,
    parse_percentiles,
    parse_priority_mix,
    parse_range,
)

T = TypeVar("T")


def _typed(parse: Callable[[str], T], what: str) -> Callable[[str], T]:
    """Wrap a parser so argparse reports its ValueError as a usage error."""

    def convert(text: str) -> T:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"bad {what} {text!r}: {exc}") from exc

    return convert


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every load generator flag to ``parser``."""
    target = parser.add_argument_group("target")
    target.add_argument("--base-url", default="http://127.0.0.1:8000")
    target.add_argument(
        "--endpoint",
        choices=("completions", "chat"),
        default="completions",
        help="POST /v1/completions or /v1/chat/completions",
    )
    target.add_argument("--model", default="mock")
    target.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    target.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="per-request limit in seconds, counted as a timeout failure",
    )
    target.add_argument(
        "--in-process",
        action="store_true",
        help="send the same traffic to the in-process baseline server instead",
    )
    target.add_argument(
        "--tokens-per-second", type=float, default=50.0, help="baseline model decode speed"
    )
    target.add_argument(
        "--prefill-seconds-per-token",
        type=float,
        default=0.0001,
        help="baseline model prefill time per prompt token",
    )
    target.add_argument(
        "--baseline-concurrency",
        type=int,
        default=16,
        help="baseline server slots (match the pipeline's workers x concurrency)",
    )

    traffic = parser.add_argument_group("traffic")
    traffic.add_argument(
        "--request-rate",
        type=float,
        default=float("inf"),
        help="open-loop arrivals per second; inf sends all at once",
    )
    traffic.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        help="gamma shape of inter-arrivals: 1 = Poisson, < 1 burstier",
    )
    traffic.add_argument(
        "--max-concurrency",
        type=int,
        default=None,
        help="cap on in-flight requests of the open loop",
    )
    traffic.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="closed loop: N users, each sending when its last request ends",
    )
    traffic.add_argument(
        "--ramp-up",
        type=_typed(parse_pair, "ramp"),
        default=None,
        metavar="START:END",
        help="linear request-rate ramp over the run",
    )
    traffic.add_argument("--duration", type=float, default=None, help="run length in seconds")
    traffic.add_argument(
        "--num-requests",
        type=int,
        default=None,
        help="measured requests (default 100 when no --duration)",
    )
    traffic.add_argument(
        "--warmup", type=int, default=0, help="requests sent first and excluded from the figures"
    )
    traffic.add_argument(
        "--prompt-tokens",
        type=_typed(parse_range, "range"),
        default=(100, 100),
        metavar="N|LOW:HIGH",
    )
    traffic.add_argument(
        "--output-tokens",
        type=_typed(parse_range, "range"),
        default=(100, 100),
        metavar="N|LOW:HIGH",
        help="max_tokens of each request",
    )
    traffic.add_argument(
        "--dataset",
        default=None,
        metavar="FILE.jsonl",
        help='lines of {"prompt": str, "max_tokens": int, "priority": int?}',
    )
    traffic.add_argument(
        "--priority-mix",
        type=_typed(parse_priority_mix, "mix"),
        default=None,
        metavar="P:W,...",
        help="priorities and weights, e.g. 0:0.2,5:0.8",
    )
    traffic.add_argument("--seed", type=int, default=0, help="seed of arrivals and prompts")

    report = parser.add_argument_group("report")
    report.add_argument(
        "--goodput",
        nargs="+",
        default=None,
        metavar="METRIC:MS",
        help="SLOs, e.g. ttft:500 tpot:50 e2el:5000",
    )
    report.add_argument(
        "--percentiles",
        type=_typed(parse_percentiles, "percentiles"),
        default=(50.0, 90.0, 99.0),
        metavar="50,90,99",
    )
    report.add_argument("--output", default=None, metavar="results.json")
    report.add_argument("--plots", default=None, metavar="DIR", help="write PNG plots here")
    report.add_argument("--no-progress", action="store_true", help="no live progress bar")


def config_from_args(args: argparse.Namespace) -> LoadConfig:
    """Build (and validate) the run's settings; raises ValueError when unusable."""
    return LoadConfig(
        base_url=args.base_url,
        endpoint=args.endpoint,
        model=args.model,
        api_key=args.api_key,
        request_rate=args.request_rate,
        burstiness=args.burstiness,
        max_concurrency=args.max_concurrency,
        concurrency=args.concurrency,
        ramp_up=args.ramp_up,
        duration=args.duration,
        num_requests=args.num_requests,
        warmup=args.warmup,
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
        dataset=args.dataset,
        priority_mix=args.priority_mix,
        seed=args.seed,
        goodput=parse_goodput(args.goodput) if args.goodput else {},
        percentiles=args.percentiles,
        timeout=args.timeout,
        in_process=args.in_process,
        tokens_per_second=args.tokens_per_second,
        prefill_seconds_per_token=args.prefill_seconds_per_token,
        baseline_concurrency=args.baseline_concurrency,
        progress=not args.no_progress,
    )


def main(args: argparse.Namespace) -> int:
    """Run the load, print the summary, write the requested files; return the exit code."""
    from loadgen.report import format_summary, write_json
    from loadgen.runner import run_load

    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"llmq loadgen: {exc}", file=sys.stderr)
        return 2
    try:
        result = asyncio.run(run_load(config))
    except (ValueError, OSError) as exc:  # e.g. an unreadable or malformed dataset
        print(f"llmq loadgen: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("llmq loadgen: interrupted", file=sys.stderr)
        return 130
    print(format_summary(result))
    if args.output:
        print(f"results: {write_json(result, args.output)}")
    if args.plots:
        from loadgen.plots import write_plots

        for path in write_plots(result, args.plots):
            print(f"plot: {path}")
    return 0 if result.summary()["completed"] else 1
