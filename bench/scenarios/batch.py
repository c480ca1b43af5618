"""A batch on the pool's idle capacity, beside interactive traffic.

Three runs on one stack (workers x slots of the mock model, which never stops by
itself, so every request has its full length):

1. **batch alone**: a batch of lines shaped like the interactive requests, on an idle
   pool, for ``probe_s`` seconds: the lines finished per second over its last three
   quarters are the pool's capacity as the batch sees it (then it is cancelled).
2. **interactive alone**: Poisson arrivals at ``load_share`` (60 %) of that capacity.
3. **interactive + batch**: the same arrivals (same seed) while a batch of ``lines``
   runs; the batch is cancelled when the interactive run ends.

Targets (issue 47): interactive p99 TTFT with the batch at most 1.2 x without it;
the batch's throughput during run 3 at least 80 % of the spare capacity (capacity
less the interactive rate); and each of a sample of the batch's output lines equal
to the same request run alone (seeded).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from bench import traffic
from bench.procs import Stack
from bench.report import fmt, pct, table, target_line
from bench.scenario import Context, ScenarioResult, Target
from bench.stats import median_of

TTFT_FACTOR = 1.2
SPARE_SHARE = 0.8
ENDED = ("completed", "expired", "cancelled", "failed")


@dataclass(frozen=True)
class Sizes(traffic.Requests):
    workers: int = 2
    slots: int = 4
    load_share: float = 0.6
    requests: int = 300
    lines: int = 5000
    probe_s: float = 15.0
    sample: int = 20


QUICK = Sizes(requests=40, lines=300, probe_s=4.0, sample=5, output_tokens=16)


def _line(s: Sizes, i: int) -> dict[str, Any]:
    words = " ".join(f"w{(i * 7 + k) % 97}" for k in range(s.prompt_tokens))
    return {
        "custom_id": f"line-{i}",
        "method": "POST",
        "url": "/v1/completions",
        "body": {"model": "mock", "prompt": words, "max_tokens": s.output_tokens, "seed": i},
    }


class _Batch:
    """One batch through the HTTP API (upload, create, read, cancel)."""

    def __init__(self, http: httpx.Client, s: Sizes) -> None:
        self.http = http
        content = "".join(json.dumps(_line(s, i)) + "\n" for i in range(s.lines))
        uploaded = http.post(
            "/v1/files", files={"file": ("in.jsonl", content)}, data={"purpose": "batch"}
        )
        uploaded.raise_for_status()
        created = http.post(
            "/v1/batches",
            json={
                "input_file_id": uploaded.json()["id"],
                "endpoint": "/v1/completions",
                "completion_window": "24h",
            },
        )
        created.raise_for_status()
        self.id = created.json()["id"]
        self.started = time.monotonic()

    def state(self) -> dict[str, Any]:
        got = self.http.get(f"/v1/batches/{self.id}")
        got.raise_for_status()
        return dict(got.json())

    def done(self) -> int:
        counts = self.state()["request_counts"]
        return int(counts["completed"]) + int(counts["failed"])

    def cancel(self) -> dict[str, Any]:
        self.http.post(f"/v1/batches/{self.id}/cancel").raise_for_status()
        deadline = time.monotonic() + 120
        state = self.state()
        while state["status"] not in ENDED and time.monotonic() < deadline:
            time.sleep(0.2)
            state = self.state()
        return state


def _exact(http: httpx.Client, s: Sizes, state: dict[str, Any]) -> dict[str, Any]:
    """How many of a sample of the batch's output lines equal the request run alone."""
    if not state.get("output_file_id"):
        return {"checked": 0, "equal": 0, "differ": []}
    text = http.get(f"/v1/files/{state['output_file_id']}/content").text
    lines = [json.loads(raw) for raw in text.splitlines()][: s.sample]
    equal = 0
    differ: list[dict[str, Any]] = []
    for line in lines:
        i = int(line["custom_id"].removeprefix("line-"))
        alone = http.post("/v1/completions", json=_line(s, i)["body"]).json()
        got = line["response"]["body"]["choices"][0]["text"]
        if got == alone["choices"][0]["text"]:
            equal += 1
        else:
            differ.append({"line": line, "alone": alone["choices"][0]["text"]})
    return {"checked": len(lines), "equal": equal, "differ": differ}


def run(ctx: Context) -> ScenarioResult:
    s = QUICK if ctx.quick else Sizes()
    worker_env = {
        "LLMQ_CONCURRENCY": str(s.slots),
        "LLMQ_MODEL_TOKENS_PER_SECOND": str(s.tokens_per_second),
        "LLMQ_MODEL_PREFILL_SECONDS_PER_TOKEN": str(s.prefill_seconds_per_token),
        "LLMQ_MODEL_MEAN_TOKENS": "0",
    }
    runs: list[dict[str, Any]] = []
    with Stack(ctx.log_dir) as stack, httpx.Client(base_url=stack.url, timeout=120) as http:
        stack.scale(s.workers, worker_env)
        for i in range(ctx.repeats):
            ctx.say(f"  batch alone {i + 1}/{ctx.repeats}")
            probe = _Batch(http, s)
            time.sleep(s.probe_s / 4)  # the pool fills up first
            began, before = time.monotonic(), probe.done()
            time.sleep(s.probe_s * 3 / 4)
            capacity = (probe.done() - before) / (time.monotonic() - began)
            probe.cancel()
            rate = s.load_share * capacity
            config = s.load(
                i, timeout=300.0, request_rate=rate, num_requests=s.requests, base_url=stack.url
            )
            ctx.say(f"  interactive alone at {rate:.1f} req/s")
            alone = traffic.figures(traffic.run(config))
            ctx.say("  interactive with the batch")
            batch = _Batch(http, s)
            began, before = time.monotonic(), batch.done()
            beside = traffic.figures(traffic.run(config))
            through = (batch.done() - before) / (time.monotonic() - began)
            state = batch.cancel()
            spare = capacity - rate
            runs.append(
                {
                    "capacity_lines_per_s": capacity,
                    "interactive_rate": rate,
                    "spare_per_s": spare,
                    "batch_lines_per_s": through,
                    "batch_share_of_spare": through / spare if spare > 0 else None,
                    "ttft_ms_p99_alone": alone["ttft_ms_p99"],
                    "ttft_ms_p99_with_batch": beside["ttft_ms_p99"],
                    "ttft_p99_ratio": (
                        beside["ttft_ms_p99"] / alone["ttft_ms_p99"]
                        if alone["ttft_ms_p99"]
                        else None
                    ),
                    "failed_alone": alone["failed"],
                    "failed_with_batch": beside["failed"],
                    "exact": _exact(http, s, state),
                }
            )
    ratio = median_of(runs, "ttft_p99_ratio")
    share = median_of(runs, "batch_share_of_spare")
    exact = [{k: r["exact"][k] for k in ("checked", "equal")} for r in runs]
    all_equal = all(e["checked"] and e["equal"] == e["checked"] for e in exact)
    targets = [
        Target(
            f"interactive p99 TTFT with the batch at most {TTFT_FACTOR} x without it",
            None if ratio is None else ratio <= TTFT_FACTOR,
            f"ratio {fmt(ratio, 2)}",
        ),
        Target(
            f"batch throughput at least {SPARE_SHARE:.0%} of the spare capacity",
            None if share is None else share >= SPARE_SHARE,
            f"share {pct(share)}",
        ),
        Target("sampled batch lines equal the request run alone", all_equal, str(exact)),
    ]
    rows = [
        [k, fmt(median_of(runs, k), 2)]
        for k in (
            "capacity_lines_per_s",
            "interactive_rate",
            "batch_lines_per_s",
            "ttft_ms_p99_alone",
            "ttft_ms_p99_with_batch",
        )
    ]
    md = "\n".join(
        [
            table(["figure (median over repeats)", "value"], rows),
            "",
            *(target_line(t.description, t.met, t.detail) for t in targets),
        ]
    )
    data = {"sizes": asdict(s), "runs": runs}
    return ScenarioResult(
        "batch", "A batch on idle capacity beside live traffic", data, md, targets
    )
