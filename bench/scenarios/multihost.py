"""Many hosts: latency across network namespaces, and repeated partitions and failovers.

The cluster (``rigs.netns``): Redis primary + replica + three Sentinels on three
hosts, two API hosts, three worker hosts; the load comes from the root namespace's
address on the bridge, so every hop of the pipeline crosses a veth pair and the
bridge. Three parts:

* latency: the light load against API host 2, against API host 1 (which answers
  only once a replica holds the enqueue, ``LLMQ_ENQUEUE_MIN_REPLICAS=1``), and
  against the same stack (three workers, one API, one Redis) on loopback,
  interleaved; TTFT and ITL medians and their ratios;
* worker partitions: one stream at a time; the link of the host running it is cut
  mid-stream and healed once the stream has ended;
* Redis failovers: four streams; the primary is SIGKILLed and restarted (it comes
  back as a replica).

Stall: the client's longest wait for a chunk after the fault (chunks in flight at
the fault do not end it).

After each fault the client's text is compared with the mock model's output for
its seed (tokens lost or duplicated at the client) and the request's stream in
Redis is read back (indices stored twice, indices missing).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from bench import traffic
from bench.procs import Stack as LocalStack
from bench.report import fmt, table, target_line
from bench.scenario import Context, ScenarioResult, Target, interleave
from bench.scenarios import host_faults
from bench.stats import median, median_of, paired_ratios
from loadgen import LoadConfig
from rigs.hosts import Stack, start_stack
from rigs.netns import Cluster


@dataclass(frozen=True)
class Sizes(traffic.Requests):
    rate: float = 4.0
    requests: int = 40
    warmup: int = 3
    partitions: int = 50
    partition_tokens: int = 150
    failovers: int = 10
    failover_streams: int = 4
    failover_tokens: int = 250
    lease_seconds: float = 1.5
    heartbeat_seconds: float = 0.5


QUICK = Sizes(requests=8, partitions=2, failovers=1, failover_tokens=150)
LATENCY = ("ttft_ms_median", "ttft_ms_p99", "itl_ms_median", "e2el_ms_median")


def run(ctx: Context) -> ScenarioResult:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        note = "Skipped: network namespaces need root and iproute2."
        return ScenarioResult("multihost", "Many hosts", {"skipped": note}, note, [])
    s = QUICK if ctx.quick else Sizes()
    with Cluster() as cluster:
        stack = _stack(cluster, s)
        latency = _latency(ctx, s, stack)
        post_ms = _post_costs(ctx, stack)
        ctx.say(f"  {s.partitions} worker partitions")
        partitions = [
            asyncio.run(host_faults.partition(stack, i, s.partition_tokens, s.tokens_per_second))
            for i in range(s.partitions)
        ]
        ctx.say(f"  {s.failovers} Redis failovers")
        failovers = _failovers(stack, s, s.failovers)
    return _result(ctx, s, latency, post_ms, partitions, failovers)


# -- latency ----------------------------------------------------------------------------


def run_failovers(ctx: Context) -> ScenarioResult:
    """Only the Redis failovers of :func:`run`, ``--repeats`` of them (1 with ``--quick``).

    The same cluster and workers as the full scenario, without its latency and
    partition parts: a failover that stalls longer than expected is reproduced in a
    few minutes, with the Sentinels' events of each kill in the results.
    """
    if os.geteuid() != 0 or shutil.which("ip") is None:
        note = "Skipped: network namespaces need root and iproute2."
        return ScenarioResult("multihost-failovers", "Redis failovers", {"skipped": note}, note, [])
    s = QUICK if ctx.quick else Sizes()
    count = 1 if ctx.quick else ctx.repeats
    with Cluster() as cluster:
        stack = _stack(cluster, s)
        ctx.say(f"  {count} Redis failovers")
        failovers = _failovers(stack, s, count)
    part = _failover_part(failovers)
    fault_table = table(FAULT_HEADERS, [_fault_row("Redis failover", part["streams"], count)])
    md = "\n\n".join(
        [
            f"Redis failovers only ({count}, each under {s.failover_streams} streams of "
            f"{s.failover_tokens} tokens at {s.tokens_per_second:g} tok/s; Sentinel "
            "down-after 1 s).",
            fault_table,
            *part["text"],
            *(target_line(t.description, t.met, t.detail) for t in part["targets"]),
        ]
    )
    data = {"settings": asdict(s), "failovers": failovers, **part["data"]}
    return ScenarioResult("multihost-failovers", "Redis failovers", data, md, part["targets"])


def _stack(cluster: Cluster, s: Sizes) -> Stack:
    worker = {
        "model_tokens_per_second": s.tokens_per_second,
        "concurrency": 16,
        "lease_seconds": s.lease_seconds,
        "heartbeat_seconds": s.heartbeat_seconds,
    }
    stack = start_stack(cluster, sentinel=True, worker=worker, api_hosts=("api2",))
    stack.start_api("api1", enqueue_min_replicas=1, enqueue_replica_timeout_ms=1000)
    stack.wait_ready()
    return stack


def _failovers(stack: Stack, s: Sizes, count: int) -> list[dict[str, Any]]:
    return [
        asyncio.run(
            host_faults.failover(
                stack, i, s.failover_streams, s.failover_tokens, s.tokens_per_second
            )
        )
        for i in range(count)
    ]


def _failover_part(failovers: list[dict[str, Any]]) -> dict[str, Any]:
    """The failovers' stall target, figures and the Sentinels' events of slow ones.

    The client's stall is judged against the failover it sat through: a failover
    that took the Sentinels 14 s stalls every stream for at least that long, and
    only what comes on top of it (reconnecting, claiming, relaying) is llmq's.
    """
    streams = [c for f in failovers for c in f["streams"]]
    stalls = [x["stall_s"] for x in streams if x["stall_s"] is not None]
    beyond = [x["beyond_failover_s"] for x in streams if x.get("beyond_failover_s") is not None]
    times = [f["failover_s"] for f in failovers]
    failover_med = median(times)
    b_max = max(beyond) if beyond else None
    slowest = max(times) if times else None
    targets = [
        Target(
            "every failover stall <= its failover time + 2 s",
            None if b_max is None else b_max <= 2.0,
            f"stall beyond the failover median {fmt(median(beyond), 2)} s, max "
            f"{fmt(b_max, 2)} s; stall max {fmt(max(stalls) if stalls else None, 2)} s; "
            f"failover median {fmt(failover_med, 2)} s, max {fmt(slowest, 2)} s",
        )
    ]
    text = []
    slow = [
        (i, f)
        for i, f in enumerate(failovers)
        if failover_med and f["failover_s"] > failover_med + 2
    ]
    for i, f in slow:
        events = "; ".join(
            f"{host}: {' '.join(ev) or '(none)'}"
            for host, ev in f.get("sentinel_events", {}).items()
        )
        text.append(
            f"Failover {i + 1} ({f['killed']} killed) took the Sentinels "
            f"{fmt(f['failover_s'], 2)} s (median {fmt(failover_med, 2)} s). Their events "
            f"from the kill to the switch: {events}."
        )
    return {
        "streams": streams,
        "targets": targets,
        "text": text,
        "data": {
            "failover_stall_s": {"median": median(stalls), "max": max(stalls) if stalls else None},
            "failover_stall_beyond_s": {"median": median(beyond), "max": b_max},
            "failover_s": {"median": failover_med, "max": slowest},
        },
    }


FAULT_HEADERS = [
    "fault",
    "faults",
    "streams",
    "stall median (s)",
    "stall max (s)",
    "tokens lost at client",
    "tokens duplicated at client",
    "streams not finished",
    "indices stored twice",
    "indices missing in Redis",
]


def _fault_row(label: str, items: list[dict[str, Any]], faults: int) -> list[str]:
    values = [x["stall_s"] for x in items if x["stall_s"] is not None]

    def total(key: str) -> int:
        return int(sum(x[key] for x in items))

    return [
        label,
        str(faults),
        str(len(items)),
        fmt(median(values), 2),
        fmt(max(values) if values else None, 2),
        str(total("client_lost")),
        str(total("client_duplicated")),
        str(sum(not x["finished"] for x in items)),
        str(total("stored_duplicates")),
        str(total("stored_missing")),
    ]


def _config(s: Sizes, seed: int, url: str) -> LoadConfig:
    return s.load(
        seed,
        timeout=60.0,
        base_url=url,
        request_rate=s.rate,
        num_requests=s.requests,
        warmup=s.warmup,
    )


def _latency(ctx: Context, s: Sizes, stack: Stack) -> dict[str, list[dict[str, Any]]]:
    env = {
        "LLMQ_CONCURRENCY": "16",
        "LLMQ_MODEL_TOKENS_PER_SECOND": str(s.tokens_per_second),
    }
    with LocalStack(ctx.log_dir) as local:
        local.scale(3, env)

        def system(url: str) -> Any:
            return lambda i: traffic.figures(traffic.run(_config(s, i, url)))

        return interleave(
            ctx,
            ctx.repeats,
            [
                ("hosts", system(stack.api_url("api2"))),
                ("hosts, enqueue WAIT 1 replica", system(stack.api_url("api1"))),
                ("loopback", system(local.url)),
            ],
        )


POSTS = 50


async def _post_ms(url: str) -> float | None:
    """Median time to the 202 of ``POSTS`` native submissions, one after the other."""
    times = []
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        for _ in range(POSTS):
            began = time.perf_counter()
            body = {"model": "mock", "prompt": "p", "max_tokens": 1}
            if (await http.post("/v1/requests", json=body)).status_code == 202:
                times.append((time.perf_counter() - began) * 1000)
    return median(times)


def _post_costs(ctx: Context, stack: Stack) -> dict[str, float | None]:
    """What waiting for a replica adds to accepting a request, interleaved."""
    runs = interleave(
        ctx,
        ctx.repeats,
        [
            ("plain", lambda i: {"ms": asyncio.run(_post_ms(stack.api_url("api2")))}),
            ("wait", lambda i: {"ms": asyncio.run(_post_ms(stack.api_url("api1")))}),
        ],
    )
    return {name: median_of(r, "ms") for name, r in runs.items()}


# -- report -----------------------------------------------------------------------------


def _result(
    ctx: Context,
    s: Sizes,
    latency: dict[str, list[dict[str, Any]]],
    post_ms: dict[str, float | None],
    partitions: list[dict[str, Any]],
    failovers: list[dict[str, Any]],
) -> ScenarioResult:
    names = list(latency)
    rows = [
        [key]
        + [fmt(median_of(latency[n], key), 1) for n in names]
        + [fmt(paired_ratios(latency[n], latency["loopback"], key)["median"], 2) for n in names[:2]]
        for key in LATENCY
    ]
    lat_table = table(["figure", *names, "ratio hosts / loopback", "ratio WAIT / loopback"], rows)
    part = _failover_part(failovers)
    f_streams = part["streams"]

    def total(items: list[dict[str, Any]], key: str) -> int:
        return int(sum(x[key] for x in items))

    reruns = [p for p in partitions if p["rerun"]]
    p_values = [p["stall_s"] for p in reruns if p["stall_s"] is not None]
    failover_med = part["data"]["failover_s"]["median"]
    faults_table = table(
        FAULT_HEADERS,
        [
            _fault_row("worker partition", reruns, len(partitions)),
            _fault_row("Redis failover", f_streams, len(failovers)),
        ],
    )
    acked = sum(f["accepted"]["acked"] for f in failovers)
    plain = sum(f["accepted"]["plain"] for f in failovers)
    lost_acked = sum(f["missing"]["acked"] for f in failovers)
    lost_plain = sum(f["missing"]["plain"] for f in failovers)
    client_errors = (
        total(partitions, "client_lost")
        + total(partitions, "client_duplicated")
        + total(f_streams, "client_lost")
        + total(f_streams, "client_duplicated")
    )
    targets = [
        *part["targets"],
        Target(
            "no acknowledged request lost (WAIT for 1 replica)",
            lost_acked == 0 if acked else None,
            f"{lost_acked} of {acked} lost; without WAIT {lost_plain} of {plain}",
        ),
        Target(
            "no token lost or duplicated at the client over "
            f"{len(partitions) + len(failovers)} faults",
            client_errors == 0,
            f"{client_errors} tokens",
        ),
    ]
    md = "\n\n".join(
        [
            f"Light load ({s.rate:g} req/s Poisson, prompt {s.prompt_tokens}, output "
            f"{s.output_tokens}, model {s.tokens_per_second:g} tok/s) from the root "
            f"namespace, {ctx.repeats} interleaved repeats, medians of the runs:",
            lat_table,
            f"Accepting a request (`POST /v1/requests`, answer time, {POSTS} back to back "
            f"per repeat, median of the repeats): {fmt(post_ms['plain'], 2)} ms without "
            f"`WAIT`, {fmt(post_ms['wait'], 2)} ms with `WAIT` for one replica.",
            f"Faults: lease {s.lease_seconds:g} s, heartbeat {s.heartbeat_seconds:g} s; "
            f"Sentinel down-after 1 s; failover time (kill -> Sentinels name the new "
            f"primary) median {fmt(failover_med, 2)} s. Acknowledged requests: "
            f"{acked} accepted through API host 1 (WAIT) around the kills, {lost_acked} "
            f"missing on the new primary; through API host 2 (no WAIT) {plain} "
            f"accepted, {lost_plain} missing.",
            f"Worker partitions: the link of the host that the request's record names as "
            f"its worker is cut after 20 tokens; in {len(reruns)} of {len(partitions)} the "
            "request then re-ran on another host (the stall figures are over these); in "
            "the others it was no longer running there and its stream went on. Stall: "
            "the client's longest wait for a chunk after the fault.",
            faults_table,
            *part["text"],
            *(target_line(t.description, t.met, t.detail) for t in targets),
        ]
    )
    data = {
        "settings": asdict(s),
        "latency": latency,
        "post_ms_median": post_ms,
        "partitions": partitions,
        "failovers": failovers,
        "partition_stall_s": {
            "median": median(p_values),
            "max": max(p_values) if p_values else None,
        },
        **part["data"],
        "failover_s_median": failover_med,
    }
    return ScenarioResult(
        "multihost", "Many hosts: latency, partitions, failovers", data, md, targets
    )
