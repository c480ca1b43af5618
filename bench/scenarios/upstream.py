"""A real inference server behind llmq: llama.cpp's ``llama-server`` direct vs through llmq.

Same client (the load generator), same server binary and random model
(:mod:`rigs.llama`), one run: the server alone; one llmq worker in front of one
server; two workers, each with its own server; one worker that keeps requests
queued in its server too (``LLMQ_UPSTREAM_QUEUE``). Two loads per system: one stream
at a time (what the pipeline adds to TTFT and ITL when nothing queues) and a
closed loop of twice the slots (throughput at saturation, and CPU per token of
every process: llmq's beside the server's). TTFT is also measured request by
request, one direct, one through the relay floor and one through llmq 1+1 in turn
(:mod:`bench.paired`): runs of separate systems differ from each other by more than
llmq adds to a first token, and the floor (the same process hops through Redis with
nothing else of llmq) says how much of what llmq adds the hops alone cost on this
machine; ``--scenarios upstream-ttft`` runs those requests alone (:func:`run_ttft`).

With the tests' tiny model the server decodes a token in well under a millisecond
here, so llmq's own costs are not hidden behind a slow model: this is the harshest
ratio a real (slower) model would show. ``--scenarios upstream-small`` (and
``upstream-small-ttft``) run the same on a larger random model (:data:`SHAPES`), whose
token costs the engine several times as much: how llmq's share shrinks as the
engine's work grows. Each system runs twice: with every process free to run on
any CPU (the engine competes with llmq's processes for the cores, which on a
small machine costs it throughput no GPU engine would lose), and with the engines
pinned to CPUs of their own (:class:`Placement`), as a GPU engine has its device,
where llmq's processes and the load generator share the CPUs left (fewer than
llmq would get beside a GPU). Each target is judged in both. A placement's runs go
in rounds, every system once per round (:func:`_measure`): a VM's speed drifts over
minutes, and a throughput target is judged round by round. The relay floor runs in
the rounds too: what it keeps of direct's throughput is what the hops alone keep.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from bench import traffic
from bench.paired import difference_key, paired_ttft
from bench.procs import FloorServer, Stack
from bench.report import fmt, table, target_line
from bench.scenario import Context, ScenarioResult, Target
from bench.stats import median, median_of, paired_ratios
from bench.sysinfo import CpuMeter
from cli.supervisor import LoggedProcess
from llmq.embedded import free_port
from loadgen import LoadConfig
from rigs.llama import (
    TinyModel,
    decode_totals,
    llama_server_argv,
    served_model,
    wait_ready,
    write_tiny_gguf,
)

#: The random models the scenarios serve, by the name llmq serves each under:
#: ``tiny``, the tests' model (a token costs the server about a tenth of a
#: millisecond on these VMs, a 32-token prefill a few); ``small``, the same kind of
#: model with wider and more layers (a token about 4 ms, the prefill about 100 ms):
#: still far cheaper than a real model on a CPU, and near a GPU engine's step.
SHAPES = {"tiny": TinyModel(), "small": TinyModel(n_embd=512, n_layer=8, n_ff=1536)}


@dataclass(frozen=True)
class Sizes:
    slots: int = 4
    prompt_tokens: int = 32
    output_tokens: int = 64
    light_s: float = 8.0
    saturated_s: float = 8.0
    #: Rounds of one request to each of :data:`DIRECT`, :data:`FLOOR` and :data:`LLMQ`,
    #: in turn (:mod:`bench.paired`).
    rounds: int = 200
    #: The served model, a key of :data:`SHAPES`.
    model: str = "tiny"

    def load(self, url: str, seed: int, **run: Any) -> LoadConfig:
        """The scenario's requests to ``url``; ``run``: the rest of the load (users, time)."""
        return LoadConfig(
            base_url=url,
            model=self.model,
            prompt_tokens=(self.prompt_tokens, self.prompt_tokens),
            output_tokens=(self.output_tokens, self.output_tokens),
            seed=seed,
            timeout=120.0,
            **run,
        )

    def write_model(self, folder: Path) -> Path:
        """The served model's weights, written into ``folder`` (the run's logs, which
        go when the run ends: the ``small`` model is a hundred megabytes)."""
        return write_tiny_gguf(folder / f"{self.model}.gguf", SHAPES[self.model])

    def scenario(self, name: str) -> str:
        """The scenario's name for this model: ``upstream-small-ttft`` for ``small``."""
        return name if self.model == "tiny" else name.replace("upstream", f"upstream-{self.model}")

    @property
    def described(self) -> str:
        """The server and its model, for the reports."""
        shape = SHAPES[self.model]
        return (
            f"llama.cpp `llama-server` ({self.model} random model: {shape.n_layer} layers of "
            f"width {shape.n_embd}; {self.slots} slots, 1 thread)"
        )


QUICK = Sizes(light_s=2.0, saturated_s=2.0, rounds=20)
#: The ``small`` model's sizes: fewer rounds in turn, each request taking longer.
SMALL = Sizes(rounds=100, model="small")
QUICK_SMALL = replace(QUICK, model="small", output_tokens=8)
TTFT_RATIO, TTFT_SLACK_MS, ITL_SLACK_MS, THROUGHPUT_SHARE = 1.05, 3.0, 2.0, 0.95
#: The system whose worker keeps as many requests queued in its server as it has slots
#: (``LLMQ_UPSTREAM_QUEUE``), as the direct client's surplus streams wait there.
QUEUED = "llmq-queued"
#: The server alone; the relay floor, every hop a request through llmq makes (API
#: process, Redis, a process in front of the server, Redis, API process) and nothing
#: else of llmq (:mod:`bench.floor_via_redis` with ``--upstream``); llmq 1+1.
DIRECT, FLOOR, LLMQ = "direct", "relay floor", "llmq"
#: The systems every round runs, and how the runs name them. The floor runs in the
#: rounds too: what its throughput keeps of direct's is what the hops alone cost the
#: engine, beside what llmq keeps.
SYSTEMS = (DIRECT, LLMQ, "llmq-2", QUEUED, FLOOR)
SYSTEM_NAMES = {
    DIRECT: "direct",
    LLMQ: "llmq, 1 worker + 1 server",
    "llmq-2": "llmq, 2 workers + 2 servers",
    QUEUED: "llmq, 1+1, upstream queue",
    FLOOR: "relay floor, 1 server",
}
#: Requests in turn (:mod:`bench.paired`), one to each of :data:`DIRECT`,
#: :data:`FLOOR` and :data:`LLMQ`.
PAIRED = "paired"
FLOOR_NOTE = (
    "The relay floor (`bench/floor_via_redis.py --upstream`) makes every hop a request "
    "through llmq makes, and nothing else: a raw ASGI server LPUSHes the request to "
    "Redis, a process BRPOPs it and streams it from its own server (the connection "
    "opened ahead, as llmq's worker does), XADDs each chunk's text to a Redis stream "
    "that the server's one XREAD relays as SSE; no queue, priority, lease, fence, "
    "record, pydantic or retry. What it adds to the server's own TTFT is what the "
    "hops cost on this machine; llmq - floor is llmq's own."
)
#: Added to a placement's seed for the prompts that time each system's server alone:
#: prompts that the rounds through the systems never sent.
SERVERS_SEED = 10_000
#: The two placements every run measures (:class:`Placement`).
SHARED, PINNED = "shared CPUs", "engine pinned"


@dataclass(frozen=True)
class Placement:
    """Which CPUs the engines run on and which the rest (llmq, Redis, the load generator).

    A GPU engine has its device to itself; here the engine is a CPU process, and on a
    machine this small the scheduler otherwise shares its core with llmq's processes,
    differently from run to run. The pinned runs put the engines on the last CPUs
    (one each while at least one CPU is left for the rest, else all on the last) and
    everything else on the others, for the direct runs as through llmq.
    """

    engines: tuple[int, ...]
    rest: tuple[int, ...]

    @classmethod
    def for_engines(cls, count: int) -> Placement | None:
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            return None
        take = count if len(cpus) > count else 1
        return cls(tuple(cpus[-take:]), tuple(cpus[:-take]))

    def engine(self, i: int) -> int:
        return self.engines[i % len(self.engines)]


@contextmanager
def placed(placement: Placement | None) -> Iterator[None]:
    """This process, and so every process it starts (Redis, the API, the workers), on
    the CPUs left to the rest, until the block ends."""
    if placement is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, placement.rest)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@contextmanager
def start_servers(
    count: int, model: Path, s: Sizes, log_dir: Path, placement: Placement | None = None
) -> Iterator[list[LoggedProcess]]:
    started: list[LoggedProcess] = []
    try:
        for i in range(count):
            port = free_port()
            argv = llama_server_argv(model, port, slots=s.slots, context=s.slots * 1024)
            if placement is not None:  # every thread of the server, from its start
                argv = ["taskset", "--cpu-list", str(placement.engine(i)), *argv]
            server = LoggedProcess(argv, {}, log_dir / f"llama-{i + 1}.log", name=f"llama-{port}")
            started.append(server)
            wait_ready(f"http://127.0.0.1:{port}", server.popen)
        yield started
    finally:
        for server in started:
            server.stop(10)


def server_url(server: LoggedProcess) -> str:
    return f"http://127.0.0.1:{server.name.rsplit('-', 1)[1]}"


def run_load(
    url: str,
    pids: dict[str, int],
    redis_url: str | None,
    s: Sizes,
    users: int,
    seconds: float,
    seed: int,
    *,
    servers: Sequence[str],
) -> dict[str, Any]:
    """One closed-loop run of ``users`` streams against ``url``: the load generator's
    figures, the CPU per token of each process in ``pids``, and the width of the
    ``servers``' batches (``tokens_per_step``: tokens generated per decode step)."""
    config = s.load(url, seed, concurrency=users, duration=seconds)
    before = [decode_totals(server) for server in servers]
    meter = CpuMeter({**pids, "loadgen": os.getpid()}, redis_url).start()
    result = traffic.run(config)
    cpu = meter.stop()
    after = [decode_totals(server) for server in servers]
    out = traffic.figures(result)
    generated = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
    steps = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
    out["tokens_per_step"] = generated / steps if steps else None
    tokens = out["total_output_tokens"] or 0
    cpu["llama"] = sum(v for k, v in cpu.items() if k.startswith("llama"))  # every server
    roles = ("llama", "api", "workers", "redis", "loadgen")
    out["cpu_ms_per_token"] = {
        r: cpu[r] * 1000.0 / tokens if tokens else None for r in roles if r in cpu
    }
    out["cpus_others"] = cpu["cpus_others"]
    out["errors"] = traffic.first_errors(result)
    return out


@dataclass(frozen=True)
class Front:
    """What a run's load goes through to its servers (llmq, or the relay floor): its
    URL, and its processes by role for :class:`CpuMeter`."""

    url: str
    pids: dict[str, int]
    redis_url: str | None

    @classmethod
    def of_stack(cls, stack: Stack) -> Front:
        return cls(stack.url, stack.pids(), stack.redis.url)

    @classmethod
    def of_floor(cls, floor: FloorServer) -> Front:
        """The floor's API process counts as llmq's API, its process in front of the
        server as a worker: their columns of the table."""
        roles = {"floor": "api", "model": "worker-floor"}
        return cls(floor.url, {roles[k]: v for k, v in floor.pids().items()}, floor.redis_url)


def _round(
    servers: list[LoggedProcess], front: Front | None, s: Sizes, seeds: Iterator[int]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One system's runs of a round, through ``front`` (direct when None): one stream,
    then the saturating load. Each draws prompts no run before it sent (``seeds``), so
    that no run finds its prompts in a server's prompt cache from an earlier one
    (llama-server keeps finished prompts' KV and reuses any prefix of them)."""
    pids = {"llama" if i == 0 else f"llama-{i}": p.pid for i, p in enumerate(servers)}
    redis_url = None
    url = server_url(servers[0])
    if front is not None:
        pids.update(front.pids)
        redis_url, url = front.redis_url, front.url
    urls = [server_url(server) for server in servers]
    light = run_load(url, pids, redis_url, s, 1, s.light_s, next(seeds), servers=urls)
    users = 2 * s.slots * len(servers)
    saturated = run_load(url, pids, redis_url, s, users, s.saturated_s, next(seeds), servers=urls)
    return light, saturated


def _summary(light: list[dict[str, Any]], saturated: list[dict[str, Any]]) -> dict[str, Any]:
    """A system's figures: the medians of its rounds' runs."""
    keys = ("ttft_ms_median", "ttft_ms_p99", "itl_ms_median", "itl_ms_p99", "e2el_ms_median")
    out: dict[str, Any] = {k: median_of(light, k) for k in keys}
    out["output_throughput"] = median_of(saturated, "output_throughput")
    out["tokens_per_step"] = median_of(saturated, "tokens_per_step")
    out["saturated_ttft_ms_median"] = median_of(saturated, "ttft_ms_median")
    roles = {r for run in saturated for r in run["cpu_ms_per_token"]}
    out["cpu_ms_per_token"] = {
        r: median_of([run["cpu_ms_per_token"] for run in saturated], r) for r in sorted(roles)
    }
    out["failed"] = sum((run["failed"] or 0) for run in light + saturated)
    out["runs"] = {"light": light, "saturated": saturated}
    return out


def shares_by_round(system: dict[str, Any], direct: dict[str, Any]) -> list[float]:
    """``system``'s throughput at saturation over direct's, round by round: each pair
    ran minutes apart at most, where the medians of all rounds compare runs that a
    drift in the VM's speed over the whole run may have set apart."""
    runs, direct_runs = system["runs"]["saturated"], direct["runs"]["saturated"]
    shares = paired_ratios(runs, direct_runs, "output_throughput")["each"]
    return [x for x in shares if x is not None]


def _paired(
    ctx: Context, servers: list[LoggedProcess], stack: Stack, s: Sizes, seed: int
) -> dict[str, Any]:
    """TTFT one request at a time, in turn, on three servers started together: direct
    to ``servers[1]``; through the relay floor (:data:`FLOOR`) in front of
    ``servers[2]``; and through ``stack`` with one worker driving ``servers[0]``.

    Then each system's server alone, in turn, straight from the client (``servers``,
    half as many rounds, prompts of their own): servers started together from one
    model file still differ in speed, by more than a millisecond on a prefill of the
    ``small`` model, and what each system's difference owes to its server is
    ``servers``' difference for the same two names."""
    stack.scale(1, llmq_env(servers[0], s.model))
    upstream = server_url(servers[2])
    alone = {DIRECT: server_url(servers[1]), FLOOR: upstream, LLMQ: server_url(servers[0])}
    with FloorServer(ctx.log_dir, 0.0, 0.0, upstream=upstream) as floor:
        ctx.say(f"  paired: {s.rounds} rounds of one request direct, via the floor, via llmq")
        urls = {DIRECT: alone[DIRECT], FLOOR: floor.url, LLMQ: stack.url}
        found = paired_ttft(urls, s.load(stack.url, seed), s.rounds)
    ctx.say(f"  paired: {s.rounds // 2} rounds of one request to each system's server")
    servers_alone = paired_ttft(alone, s.load(stack.url, seed + SERVERS_SEED), s.rounds // 2)
    return {**found, "servers": servers_alone, "served": served_model(alone[DIRECT])}


def llmq_env(server: LoggedProcess, model: str = "tiny") -> dict[str, str]:
    return {
        "LLMQ_MODEL": model,
        "LLMQ_BACKEND": "openai",
        "LLMQ_UPSTREAM_URL": server_url(server),
        "LLMQ_UPSTREAM_ENGINE": "llamacpp",
    }


def round_order(i: int, systems: Sequence[str] = SYSTEMS) -> tuple[str, ...]:
    """Round ``i``'s order of ``systems``: rotated by one each round, so that no
    system always runs first or last in a round."""
    k = i % len(systems)
    return (*systems[k:], *systems[:k])


def _deploy(stack: Stack, system: str, servers: list[LoggedProcess], s: Sizes) -> None:
    """``stack``'s workers as ``system`` has them, in front of its ``servers``."""
    env = llmq_env(servers[0], s.model)
    if system == QUEUED:
        env["LLMQ_UPSTREAM_QUEUE"] = str(s.slots)
    stack.scale(1, env)
    for server in servers[1:]:  # each worker its own server
        stack.add_worker(llmq_env(server, s.model))


def _measure(
    ctx: Context, s: Sizes, model: Path, placement: Placement | None, seeds: Iterator[int]
) -> dict[str, dict[str, Any]]:
    """:data:`SYSTEMS`, in rounds, the engines on their own CPUs when ``placement`` says.

    A VM's speed drifts over minutes, by as much as llmq's share of throughput (a
    server's own CPU per token moved by a third over one run), so each round runs
    every system once (:func:`round_order`) and a throughput target is judged on the
    rounds' shares (:func:`shares_by_round`). Each run gets servers started for it:
    llama-server keeps every finished prompt in a host-memory cache (``--cache-ram``)
    that each new request searches, so a server that served a run before would be
    slower for the one after. Between llmq's runs its workers stop, so that none runs
    beside another system's; its API and Redis stay, idle. The relay floor's
    processes and Redis are started for its run."""
    repeats = 1 if ctx.quick else ctx.repeats
    out: dict[str, dict[str, Any]] = {}
    runs: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {
        system: ([], []) for system in SYSTEMS
    }

    def servers(count: int) -> AbstractContextManager[list[LoggedProcess]]:
        return start_servers(count, model, s, ctx.log_dir, placement)

    with placed(placement), Stack(ctx.log_dir) as stack:
        with servers(3) as three:
            out[PAIRED] = _paired(ctx, three, stack, s, next(seeds))
        stack.scale(0)
        for i in range(repeats):
            for system in round_order(i):
                ctx.say(f"  {SYSTEM_NAMES[system]}: round {i + 1}/{repeats}")
                with servers(2 if system == "llmq-2" else 1) as started:
                    if system == DIRECT:
                        light, saturated = _round(started, None, s, seeds)
                    elif system == FLOOR:
                        upstream = server_url(started[0])
                        with FloorServer(ctx.log_dir, 0.0, 0.0, upstream=upstream) as floor:
                            light, saturated = _round(started, Front.of_floor(floor), s, seeds)
                    else:
                        _deploy(stack, system, started, s)
                        light, saturated = _round(started, Front.of_stack(stack), s, seeds)
                        stack.scale(0)
                runs[system][0].append(light)
                runs[system][1].append(saturated)
    for system, (lights, saturateds) in runs.items():
        out[system] = _summary(lights, saturateds)
    for system in SYSTEMS[1:]:
        out[system]["throughput_shares"] = shares_by_round(out[system], out["direct"])
    return out


def run(ctx: Context) -> ScenarioResult:
    return _run(ctx, QUICK if ctx.quick else Sizes())


def run_small(ctx: Context) -> ScenarioResult:
    """``--scenarios upstream-small``: :func:`run` on the ``small`` model."""
    return _run(ctx, QUICK_SMALL if ctx.quick else SMALL)


def _run(ctx: Context, s: Sizes) -> ScenarioResult:
    model = s.write_model(ctx.log_dir)
    pinned = Placement.for_engines(2)
    seeds = itertools.count(1)
    results = {SHARED: _measure(ctx, s, model, None, seeds)}
    if pinned is not None:
        results[PINNED] = _measure(ctx, s, model, pinned, seeds)
    return _report(s, 1 if ctx.quick else ctx.repeats, results, pinned)


def run_ttft(ctx: Context) -> ScenarioResult:
    """The TTFT target alone (``--scenarios upstream-ttft``): requests in turn, in
    both placements, as the full scenario measures them, in under a minute instead
    of its quarter of an hour; for trying a change to the first token's path."""
    return _run_ttft(ctx, QUICK if ctx.quick else Sizes())


def run_small_ttft(ctx: Context) -> ScenarioResult:
    """``--scenarios upstream-small-ttft``: :func:`run_ttft` on the ``small`` model."""
    return _run_ttft(ctx, QUICK_SMALL if ctx.quick else SMALL)


def _run_ttft(ctx: Context, s: Sizes) -> ScenarioResult:
    model = s.write_model(ctx.log_dir)
    pinned = Placement.for_engines(2)
    placements = {SHARED: None} if pinned is None else {SHARED: None, PINNED: pinned}
    results: dict[str, dict[str, Any]] = {}
    for seed, (where, placement) in enumerate(placements.items(), start=1):
        ctx.say(where)
        with placed(placement), Stack(ctx.log_dir) as stack:
            with start_servers(3, model, s, ctx.log_dir, placement) as three:
                results[where] = _paired(ctx, three, stack, s, seed)
    targets = [t for where, r in results.items() for t in _paired_target(where, r)]
    parts = [
        f"{s.described}; prompt {s.prompt_tokens} words, {s.output_tokens} output tokens. "
        "One request direct, one through the relay floor and one through llmq 1+1 in "
        f"turn (`bench/paired.py`), {s.rounds} rounds, to three servers started together, "
        "with the processes on any CPU and with the servers pinned (`Placement`), as in "
        "`--scenarios upstream`. " + FLOOR_NOTE,
        *(f"**{where}**: " + _paired_line(r) for where, r in results.items()),
        *(target_line(t.description, t.met, t.detail) for t in targets),
    ]
    return _result(
        s.scenario("upstream-ttft"),
        "A real inference server: first tokens direct and through llmq, in turn",
        s,
        pinned,
        parts,
        targets,
        paired=results,
    )


def _ttft_target(
    where: str, direct: float | None, ours: float | None, more: str = ""
) -> list[Target]:
    """The TTFT target on two medians (none if either is missing); ``more``: detail."""
    if direct is None or ours is None:
        return []
    bound = max(direct * TTFT_RATIO, direct + TTFT_SLACK_MS)
    return [
        Target(
            f"{where}: median TTFT through llmq <= {TTFT_RATIO}x direct or +{TTFT_SLACK_MS:g} ms",
            ours <= bound,
            f"llmq {fmt(ours)} ms, direct {fmt(direct)} ms, bound {fmt(bound)} ms{more}",
        )
    ]


def _paired_target(where: str, paired: dict[str, Any]) -> list[Target]:
    """The TTFT target on the medians of the requests in turn (:mod:`bench.paired`)."""
    return _ttft_target(
        f"{where}, requests in turn",
        paired["ttft_ms_median"][DIRECT],
        paired["ttft_ms_median"][LLMQ],
        f"; median difference {fmt(paired['difference_ms_median'][difference_key(LLMQ, DIRECT)])}"
        f" ms over {paired['rounds']} rounds",
    )


def _targets(r: dict[str, dict[str, Any]], where: str, slots: int) -> list[Target]:
    direct, ours = r["direct"], r["llmq"]
    targets = _ttft_target(where, direct["ttft_ms_median"], ours["ttft_ms_median"])
    targets += _paired_target(where, r[PAIRED])
    d_itl, o_itl = direct["itl_ms_p99"], ours["itl_ms_p99"]
    if d_itl is not None and o_itl is not None:
        targets.append(
            Target(
                f"{where}: ITL p99 through llmq <= direct + {ITL_SLACK_MS:g} ms",
                o_itl <= d_itl + ITL_SLACK_MS,
                f"llmq {fmt(o_itl)} ms, direct {fmt(d_itl)} ms",
            )
        )
    d_tput = direct["output_throughput"]
    for system, how in (("llmq", "cap = slots"), (QUEUED, f"LLMQ_UPSTREAM_QUEUE={slots}")):
        o_tput, shares = r[system]["output_throughput"], r[system]["throughput_shares"]
        share = median(shares)
        if share is not None:
            by_round = ", ".join(f"{fmt(x * 100)} %" for x in shares)
            targets.append(
                Target(
                    f"{where}, {how}: throughput at saturation >= {THROUGHPUT_SHARE:.0%} of "
                    "direct (median of the rounds' shares)",
                    share >= THROUGHPUT_SHARE,
                    f"{fmt(share * 100)} %: by round {by_round}; medians llmq "
                    f"{fmt(o_tput)} tok/s, direct {fmt(d_tput)} tok/s",
                )
            )
    return targets


LABELS = {
    "ttft_ms_median": "TTFT median, one stream (ms)",
    "ttft_ms_p99": "TTFT p99, one stream (ms)",
    "itl_ms_median": "ITL median, one stream (ms)",
    "itl_ms_p99": "ITL p99, one stream (ms)",
    "e2el_ms_median": "E2E median, one stream (ms)",
    "output_throughput": "throughput at saturation (tok/s)",
    "saturated_ttft_ms_median": "TTFT median at saturation (ms)",
    "tokens_per_step": "server's batch at saturation (tokens per decode step)",
}
#: Digits of a figure in the table, where not 1.
DIGITS = {"tokens_per_step": 2}


def _table(r: dict[str, dict[str, Any]], slots: int) -> str:
    systems = [r[system] for system in SYSTEMS]
    rows = [[label, *(fmt(x[k], DIGITS.get(k, 1)) for x in systems)] for k, label in LABELS.items()]
    roles = sorted({role for x in systems for role in x["cpu_ms_per_token"]})
    rows += [
        [f"CPU ms/token at saturation: {role}"]
        + [fmt(x["cpu_ms_per_token"].get(role), 3) for x in systems]
        for role in roles
    ]
    head = [
        "figure",
        "direct",
        "llmq 1+1",
        "llmq 2+2",
        f"llmq 1+1, upstream queue {slots}",
        "relay floor 1+1",
    ]
    return table(head, rows)


def _shares_line(r: dict[str, dict[str, Any]]) -> str:
    """Each system's throughput at saturation as shares of direct's, round by round:
    the relay floor's beside llmq's says how much of what llmq loses the hops alone
    lose (the floor, like direct and the upstream queue, leaves the streams beyond
    the server's slots waiting in the server's own queue)."""
    parts = []
    for system in SYSTEMS[1:]:
        shares = r[system]["throughput_shares"]
        if (mid := median(shares)) is not None:
            each = ", ".join(fmt(x * 100) for x in shares)
            parts.append(f"{SYSTEM_NAMES[system]} {fmt(mid * 100)} % ({each})")
    return (
        "Throughput at saturation, share of direct's (median of the rounds; each round's "
        f"in brackets): {'; '.join(parts)}."
    )


def _drift_line(r: dict[str, dict[str, Any]]) -> str:
    """How far the machine's speed moved over a placement's saturated runs, read off the
    servers' CPU per token: the same model's token costs a server the same work in
    every run, so what moves it is mostly the machine (a smaller batch costs a little
    more per token too)."""
    spans = []
    every = []
    for system in SYSTEMS:
        per = [run["cpu_ms_per_token"].get("llama") for run in r[system]["runs"]["saturated"]]
        found = [x for x in per if x]
        every += found
        if found:
            spans.append(f"{SYSTEM_NAMES[system]} {fmt(min(found), 3)}-{fmt(max(found), 3)}")
    if not every:
        return ""
    return (
        "The servers' CPU per token at saturation, run by run (ms; the machine's speed "
        f"moves it): {'; '.join(spans)}; the slowest run's "
        f"{fmt(max(every) / min(every) * 100 - 100)} % over the fastest's."
    )


def _paired_line(p: dict[str, Any]) -> str:
    medians, differences = p["ttft_ms_median"], p["difference_ms_median"]

    def over(later: str, earlier: str) -> str:
        return fmt(differences[difference_key(later, earlier)])

    served, alone = p["served"], p["servers"]
    servers = alone["ttft_ms_median"]
    bias = alone["difference_ms_median"]
    return (
        f"Requests in turn (one direct, one via the relay floor, one through llmq 1+1, "
        f"{p['rounds']} rounds, servers started together): TTFT median direct "
        f"{fmt(medians[DIRECT])} ms, relay floor {fmt(medians[FLOOR])} ms, through llmq "
        f"{fmt(medians[LLMQ])} ms; medians of the paired differences: floor - direct "
        f"{over(FLOOR, DIRECT)} ms, llmq - direct {over(LLMQ, DIRECT)} ms, llmq - floor "
        f"{over(LLMQ, FLOOR)} ms. Each system's server alone, in turn, {alone['rounds']} "
        f"rounds after: TTFT median direct's {fmt(servers[DIRECT])} ms, the floor's "
        f"{fmt(servers[FLOOR])} ms, llmq's {fmt(servers[LLMQ])} ms; of the differences "
        f"above, the servers' own: floor's - direct's "
        f"{fmt(bias[difference_key(FLOOR, DIRECT)])} ms, llmq's - direct's "
        f"{fmt(bias[difference_key(LLMQ, DIRECT)])} ms, llmq's - floor's "
        f"{fmt(bias[difference_key(LLMQ, FLOOR)])} ms. The servers' model, as they report it: "
        f"{served['n_params'] / 1e6:.1f} M parameters, width {served['n_embd']}, "
        f"{served['size'] / 2**20:.0f} MiB."
    )


def _report(
    s: Sizes, repeats: int, results: dict[str, dict[str, dict[str, Any]]], pinned: Placement | None
) -> ScenarioResult:
    targets = [t for where, r in results.items() for t in _targets(r, where, s.slots)]
    parts = [
        f"{s.described} direct and through llmq; prompt {s.prompt_tokens} words, "
        f"{s.output_tokens} output tokens; one stream for {s.light_s:g} s, then "
        f"{2 * s.slots} streams per server for {s.saturated_s:g} s; medians of {repeats} "
        "rounds, each running every system once, in an order rotated each round (a VM's "
        "speed drifts over minutes: a throughput target is judged on the median of the "
        "rounds' shares of direct), each run on servers started for it with prompts no "
        "earlier run sent (the server would reuse their cached KV). Failed requests: "
        + "; ".join(
            f"{where}: " + ", ".join(f"{k} {v['failed']}" for k, v in r.items())
            for where, r in results.items()
        )
        + ".",
        "llmq 1+1 keeps its cap at the server's slots, so a slot that frees waits for the "
        "worker's next claim; with an upstream queue (`LLMQ_UPSTREAM_QUEUE`) the worker "
        "also keeps that many requests waiting in the server's own queue, as the direct "
        "client's surplus streams wait there, and the server starts each the step a "
        "sequence ends.",
        "The relay floor (below) runs in every round too, in front of a server of its "
        "own: its share of direct's throughput is what the hops alone keep, beside what "
        "llmq keeps (like direct and the upstream queue, it leaves the streams beyond "
        "the slots waiting in the server's own queue).",
        "Runs of separate systems differ from run to run by more than llmq adds to a "
        "first token, so TTFT is also measured request by request: one direct, one "
        "through the relay floor, one through llmq, in turn, on three servers started "
        "together (`bench/paired.py`); its target is judged on those medians as well. "
        + FLOOR_NOTE,
        f"**{SHARED}**: every process on any CPU, the servers' included.",
        _table(results[SHARED], s.slots),
        _shares_line(results[SHARED]),
        _drift_line(results[SHARED]),
        _paired_line(results[SHARED][PAIRED]),
    ]
    if pinned is not None:
        parts += [
            f"**{PINNED}**: the servers on CPU {', '.join(map(str, pinned.engines))}, "
            f"llmq, Redis and the load generator on CPU {', '.join(map(str, pinned.rest))} "
            "(`Placement`): the engine's compute is its own, as a GPU's is, and llmq's "
            "processes share what is left.",
            _table(results[PINNED], s.slots),
            _shares_line(results[PINNED]),
            _drift_line(results[PINNED]),
            _paired_line(results[PINNED][PAIRED]),
        ]
    parts += [target_line(t.description, t.met, t.detail) for t in targets]
    return _result(
        s.scenario("upstream"),
        "A real inference server: llama-server direct vs through llmq",
        s,
        pinned,
        parts,
        targets,
        systems=results,
    )


def _result(
    name: str,
    title: str,
    s: Sizes,
    pinned: Placement | None,
    parts: list[str],
    targets: list[Target],
    **found: Any,
) -> ScenarioResult:
    """A result of this module's scenarios: their sizes and placement beside what
    ``found``, the report's ``parts`` joined."""
    data = {"settings": asdict(s), "placement": None if pinned is None else asdict(pinned)}
    return ScenarioResult(name, title, {**data, **found}, "\n\n".join(parts), targets)
