"""Several choices: one request with ``n = 4`` against four requests sent at once.

llmq serves ``n`` by fanning a request out into one queued request per choice,
relayed back together. This scenario prices that against what a client would do
without ``n``: the same four generations as four concurrent streaming requests
(same prompt, same seeds). Both run against the same stack, one round at a time
(nothing else queues), interleaved per repeat.

Per round: time to the first token of any choice, to the first token of every
choice, and to the end of the last choice, from just before the request(s) left
the client.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp

from bench import traffic
from bench.procs import BenchError, Stack
from bench.report import fmt, table, target_line
from bench.scenario import Context, ScenarioResult, Target, interleave
from bench.stats import median, median_of, paired_ratios
from loadgen.sse import DONE, frames


@dataclass(frozen=True)
class Sizes(traffic.Requests):
    rounds: int = 20
    warmup: int = 2
    choices: int = 4
    concurrency: int = 8
    gap_s: float = 0.1


QUICK = Sizes(rounds=3, warmup=1)
KEYS = ("first_ms", "all_first_ms", "last_end_ms")


async def _stream(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    t0: float,
    out: dict[int, Any],
    offset: int = 0,
) -> None:
    """Read one streaming completion, noting per choice (index + ``offset``) its first
    token and its end."""
    async with session.post(url + "/v1/completions", json={**body, "stream": True}) as r:
        if r.status != 200:
            raise BenchError(f"/v1/completions answered {r.status}: {await r.text()}")
        async for frame in frames(r.content.iter_any()):
            if frame.data == DONE:
                continue
            for choice in frame.json().get("choices", []):
                i = choice["index"] + offset
                now = (time.perf_counter() - t0) * 1000
                if choice.get("text"):
                    out.setdefault(i, {"first": now})
                if choice.get("finish_reason"):
                    out.setdefault(i, {"first": now})["end"] = now


def _body(s: Sizes, seed: int) -> dict[str, Any]:
    return {
        "model": "mock",
        "prompt": " ".join(["word"] * s.prompt_tokens),
        "max_tokens": s.output_tokens,
        "seed": seed,
    }


async def _round(
    session: aiohttp.ClientSession, url: str, s: Sizes, fanned: bool, seed: int
) -> dict[str, float]:
    out: dict[int, Any] = {}
    t0 = time.perf_counter()
    if fanned:
        await _stream(session, url, {**_body(s, seed), "n": s.choices}, t0, out)
    else:
        # choice k of n runs with seed + k: the same generations, one request each
        await asyncio.gather(
            *(
                _stream(session, url, _body(s, seed + k), t0, out, offset=k)
                for k in range(s.choices)
            )
        )
    if len(out) != s.choices or any("end" not in c for c in out.values()):
        raise BenchError(f"a round ended with {len(out)} of {s.choices} choices complete")
    return {
        "first_ms": min(c["first"] for c in out.values()),
        "all_first_ms": max(c["first"] for c in out.values()),
        "last_end_ms": max(c["end"] for c in out.values()),
    }


async def _run(url: str, s: Sizes, fanned: bool, repeat: int) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session:
        for w in range(s.warmup):
            await _round(session, url, s, fanned, -1000 - w)
        rounds = []
        for r in range(s.rounds):
            rounds.append(await _round(session, url, s, fanned, repeat * 1000 + r * 10))
            await asyncio.sleep(s.gap_s)
    return {**{k: median(x[k] for x in rounds) for k in KEYS}, "rounds": rounds}


def run(ctx: Context) -> ScenarioResult:
    s = QUICK if ctx.quick else Sizes()
    env = {
        "LLMQ_CONCURRENCY": str(s.concurrency),
        "LLMQ_MODEL_TOKENS_PER_SECOND": str(s.tokens_per_second),
    }
    with Stack(ctx.log_dir) as stack:
        stack.scale(1, env)

        def fanned(i: int) -> dict[str, Any]:
            return asyncio.run(_run(stack.url, s, True, i))

        def separate(i: int) -> dict[str, Any]:
            return asyncio.run(_run(stack.url, s, False, i))

        runs = interleave(ctx, ctx.repeats, [("n", fanned), ("separate", separate)])
    med = {name: {k: median_of(rs, k) for k in KEYS} for name, rs in runs.items()}
    ratios = {k: paired_ratios(runs["n"], runs["separate"], k) for k in KEYS}
    end_ratio = ratios["last_end_ms"]["median"]
    target = Target(
        f"n={s.choices} in one request ends within 10% of {s.choices} separate requests",
        None if end_ratio is None else end_ratio <= 1.10,
        f"ratio {fmt(end_ratio, 2)}",
    )
    labels = {
        "first_ms": "first token, any choice (ms)",
        "all_first_ms": "first token, every choice (ms)",
        "last_end_ms": "last choice done (ms)",
    }
    rows = [
        [labels[k], fmt(med["n"][k]), fmt(med["separate"][k]), fmt(ratios[k]["median"], 2)]
        for k in KEYS
    ]
    md = "\n\n".join(
        [
            f"{s.rounds} rounds per run, one at a time; prompt {s.prompt_tokens} / output "
            f"{s.output_tokens} tokens, model {s.tokens_per_second:g} tok/s, 1 worker x "
            f"{s.concurrency} slots; medians of {ctx.repeats} interleaved runs; ratio = median "
            "of per-pair ratios.",
            table(
                ["figure", f"n={s.choices}, one request", f"{s.choices} requests", "ratio"], rows
            ),
            target_line(target.description, target.met, target.detail),
        ]
    )
    data = {"settings": asdict(s), "runs": runs, "medians": med, "ratios": ratios}
    return ScenarioResult(
        "choices", "Choices: n in one request vs separate requests", data, md, [target]
    )
