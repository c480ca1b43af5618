"""Recovery: a worker SIGKILLed mid-generation, and how long its clients' streams stall.

The victim worker runs every stream (it is the only worker when they start);
a second worker is started and registered before the kill, so the figure is
the recovery alone, not a worker's start-up. The victim is then SIGKILLed and
nothing tells anyone: its leases (renewed every ``heartbeat_seconds``) run out
after ``lease_seconds``, the survivor's sweep (every ``sweep_seconds``) requeues
the requests, and the survivor claims them and resumes them: it reads the tokens
already in each request's stream, prefills prompt + those tokens with the same
seed, and publishes the rest from the next index. (Tokens the victim generated but
never wrote are generated again; the API's relay drops any index it already sent.)

The headline is what an OpenAI streaming client sees: **SIGKILL -> the first
token it had not received yet**. Chunks the victim wrote before dying but that
arrive a few milliseconds after the kill do not count as recovered. Each stall
is split, with the request record (``started_at`` of the re-run) and the entry
ids of the request's stream (the millisecond each event was written), into

* restart: kill -> re-run started (lease expiry, sweep, wake-up, claim);
* replay: re-run started -> first new token written (reading the stream, the
  prefill of prompt + the tokens already sent, then one token interval; a re-run
  that started over would also generate the already-sent tokens again at model
  speed, ``tokens_written_by_victim / tokens_per_second``);
* relay: written -> received by the client.

So the stall is about ``lease - heartbeat .. lease + sweep`` plus a prefill and
one token interval, whatever the number of tokens the client already has. Every
stream's text is then compared with the mock model's deterministic output for its
seed: one lost or repeated token fails the correctness target.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from bench.procs import BenchError, BenchProcess, Stack, clean_env
from bench.report import fmt, table, target_line
from bench.scenario import Context, ScenarioResult, Target
from bench.stats import median
from cli.supervisor import wait_for
from llmq.model.interface import GenerationRequest
from llmq.settings import WorkerSettings
from loadgen.sse import DONE, frames
from worker.mock import MockBackend

#: Slack over ``lease_seconds`` allowed for the restart (sweep, wake-up, claim, load).
SLACK_S = 1.0
REPEAT_TIMEOUT_S = 120.0
PHASES = ("stall_s", "restart_s", "replay_s", "relay_s", "first_chunk_after_kill_s")


@dataclass(frozen=True)
class Sizes:
    streams: int = 4
    concurrency: int = 4
    max_tokens: int = 400
    #: Kill once every stream has received this many tokens (and the survivor is up).
    kill_after_tokens: int = 50
    tokens_per_second: float = 50.0
    prefill_seconds_per_token: float = 0.0001


#: Streams long enough (6 s) for a survivor to start on a busy machine before they end.
QUICK = Sizes(streams=2, max_tokens=300, kill_after_tokens=30)


@dataclass(frozen=True)
class Leases:
    """The worker's lease settings as used: its defaults, not overridden here."""

    lease_seconds: float
    heartbeat_seconds: float
    sweep_seconds: float

    @classmethod
    def defaults(cls) -> Leases:
        fields = WorkerSettings.model_fields
        return cls(
            lease_seconds=float(fields["lease_seconds"].default),
            heartbeat_seconds=float(fields["heartbeat_seconds"].default),
            sweep_seconds=float(fields["sweep_seconds"].default),
        )


@dataclass
class Stream:
    """One streaming client: what arrived and when (``time.monotonic()``)."""

    n: int
    seed: int
    prompt: str
    request_id: str | None = None
    #: (arrival, tokens received before this chunk, tokens in this chunk)
    chunks: list[tuple[float, int, int]] = field(default_factory=list)
    text: str = ""
    received: int = 0
    finish_reason: str | None = None
    usage_tokens: int | None = None
    done: bool = False
    error: str | None = None


async def _expected_text(s: Sizes, stream: Stream) -> str:
    """What the mock model generates for this seed: the same model, without the waits."""
    model = MockBackend(tokens_per_second=1e9, prefill_seconds_per_token=0.0)
    request = GenerationRequest(
        prompt=stream.prompt, max_tokens=s.max_tokens, seed=stream.seed, prompt_tokens=0
    )
    return "".join([token async for token in model.generate(request) if isinstance(token, str)])


async def _consume(client: httpx.AsyncClient, s: Sizes, stream: Stream) -> None:
    """Read one OpenAI completions stream to its end, noting each chunk's arrival."""
    body = {
        "model": "mock",
        "prompt": stream.prompt,
        "max_tokens": s.max_tokens,
        "seed": stream.seed,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    try:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                stream.error = f"HTTP {response.status_code}: {response.text[:300]}"
                return
            async for frame in frames(response.aiter_bytes()):
                arrived = time.monotonic()
                if frame.data == DONE:
                    stream.done = True
                    break
                chunk = frame.json()
                if "error" in chunk:
                    stream.error = json.dumps(chunk["error"])[:300]
                    continue
                stream.request_id = str(chunk["id"]).split("-", 1)[1]
                if chunk.get("usage"):
                    stream.usage_tokens = int(chunk["usage"]["completion_tokens"])
                for choice in chunk.get("choices") or []:
                    text = choice.get("text") or ""
                    if text:
                        count = len(text.split())
                        stream.chunks.append((arrived, stream.received, count))
                        stream.received += count
                        stream.text += text
                    if choice.get("finish_reason"):
                        stream.finish_reason = choice["finish_reason"]
    except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
        stream.error = f"{type(exc).__name__}: {exc}"


async def _until(
    condition: Callable[[], bool],
    what: str,
    tasks: list[asyncio.Task[None]],
    watched: list[BenchProcess],
    timeout: float = 60.0,
) -> None:
    """:func:`wait_for` ``condition``, failing early if a stream ended or a process exited.

    It polls in a thread: the streams are read by this event loop meanwhile.
    """

    def ready() -> bool:
        if condition():
            return True
        if any(task.done() for task in tasks):
            raise BenchError(f"a stream ended while waiting for {what}")
        return False

    await asyncio.to_thread(wait_for, ready, timeout, what, *watched, interval=0.02)


def _registered(url: str, pid: int) -> bool:
    try:
        response = httpx.get(url + "/v1/workers", timeout=5.0)
    except httpx.HTTPError:
        return False
    return response.status_code == 200 and any(w.get("pid") == pid for w in response.json()["data"])


async def _events(client: httpx.AsyncClient, rid: str) -> list[tuple[float, dict[str, Any]]]:
    """The request's whole event stream (native API): (written at, Unix s; event)."""
    out: list[tuple[float, dict[str, Any]]] = []
    async with client.stream("GET", f"/v1/requests/{rid}/events") as response:
        if response.status_code != 200:
            raise BenchError(f"GET /v1/requests/{rid}/events answered {response.status_code}")
        async for frame in frames(response.aiter_bytes()):
            if frame.id is not None:
                out.append((int(frame.id.split("-")[0]) / 1000.0, frame.json()))
    return out


def _stall(
    s: Sizes,
    stream: Stream,
    expected: str,
    events: list[tuple[float, dict[str, Any]]],
    record: dict[str, Any],
    kill_wall: float,
    kill_mono: float,
    victim_pid: int,
    survivor_pid: int,
) -> dict[str, Any]:
    """One stream's figures: the stall and its parts, and whether it came out right."""
    starts = [e for _, e in events if e.get("type") == "started"]
    at_start = [i for i, (_, e) in enumerate(events) if e.get("type") == "started"]
    restart = at_start[1] if len(at_start) > 1 else None  # the re-run's "started" event
    before = events if restart is None else events[:restart]
    sent_before = max(
        (e["index"] + len(e["tokens"]) for _, e in before if e.get("type") == "tokens"), default=0
    )
    written = next(
        (
            at
            for at, e in (events[restart:] if restart is not None else [])
            if e.get("type") == "tokens" and e["index"] + len(e["tokens"]) > sent_before
        ),
        None,
    )
    received = next((at for at, seen, count in stream.chunks if seen + count > sent_before), None)
    after_kill = next((at for at, _, _ in stream.chunks if at > kill_mono), None)
    at_kill = sum(count for at, _, count in stream.chunks if at <= kill_mono)
    started = record.get("started_at")
    restart_wall = float(started) if started is not None and restart is not None else None

    def wall(mono: float | None) -> float | None:
        return None if mono is None else kill_wall + (mono - kill_mono)

    def span(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else b - a

    worker = str(record.get("worker") or "")
    correct = (
        stream.error is None
        and stream.done
        and stream.text == expected
        and stream.received == s.max_tokens
        and stream.usage_tokens == s.max_tokens
        and stream.finish_reason == "length"
    )
    return {
        "request_id": stream.request_id,
        "stall_s": span(kill_mono, received),
        "first_chunk_after_kill_s": span(kill_mono, after_kill),
        "restart_s": span(kill_wall, restart_wall),
        "replay_s": span(restart_wall, written),
        "relay_s": span(written, wall(received)),
        "tokens_at_kill": at_kill,
        "tokens_written_by_victim": sent_before,
        "replay_model_s": sent_before / s.tokens_per_second,
        "received_tokens": stream.received,
        "usage_completion_tokens": stream.usage_tokens,
        "finish_reason": stream.finish_reason,
        "text_matches_model": stream.text == expected,
        "attempts": record.get("attempts"),
        "started_events": len(starts),
        "first_worker_was_victim": bool(starts) and f"-{victim_pid}-" in str(starts[0]["worker"]),
        "final_worker_is_survivor": f"-{survivor_pid}-" in worker,
        "error": stream.error,
        "correct": correct,
    }


async def _repeat(
    stack: Stack, s: Sizes, victim: BenchProcess, env: dict[str, str], ctx: Context, i: int
) -> tuple[dict[str, Any], BenchProcess]:
    """Streams on ``victim``; start a survivor; SIGKILL the victim; follow the streams."""
    streams = [
        Stream(n, seed=1000 * (i + 1) + n, prompt=f"recovery probe {i} {n}")
        for n in range(s.streams)
    ]
    timeout = httpx.Timeout(60.0, connect=10.0)
    async with httpx.AsyncClient(base_url=stack.url, timeout=timeout) as client:
        tasks = [asyncio.create_task(_consume(client, s, st)) for st in streams]
        try:
            watched = [victim]
            assert stack.api is not None
            watched.append(stack.api)

            def flowing() -> bool:
                return all(st.received >= 1 for st in streams)

            await _until(flowing, "every stream's first token", tasks, watched)
            for st in streams:
                record = (await client.get(f"/v1/requests/{st.request_id}")).json()
                if f"-{victim.pid}-" not in str(record.get("worker")):
                    where = record.get("worker")
                    raise BenchError(f"stream {st.n} runs on {where}, not on the victim")
            spawned = time.monotonic()
            survivor = BenchProcess(f"recovery-worker-{i + 2}", ["cli", "worker"], env, ctx.log_dir)
            stack.workers.append(survivor)
            watched.append(survivor)

            def survivor_up() -> bool:
                return _registered(stack.url, survivor.pid)

            await _until(survivor_up, "the survivor to register", tasks, watched)
            survivor_ready_s = time.monotonic() - spawned
            tokens_at_ready = min(st.received for st in streams)

            def far_enough() -> bool:
                return all(st.received >= s.kill_after_tokens for st in streams)

            await _until(far_enough, f"{s.kill_after_tokens} tokens per stream", tasks, watched)
            kill_wall, kill_mono = time.time(), time.monotonic()
            victim.popen.send_signal(signal.SIGKILL)
            async with asyncio.timeout(REPEAT_TIMEOUT_S):
                await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*tasks, return_exceptions=True)
        per_stream = []
        for st in streams:
            if st.request_id is None:
                raise BenchError(f"stream {st.n} never got an id: {st.error}")
            record = (await client.get(f"/v1/requests/{st.request_id}")).json()
            events = await _events(client, st.request_id)
            expected = await _expected_text(s, st)
            per_stream.append(
                _stall(
                    s, st, expected, events, record, kill_wall, kill_mono, victim.pid, survivor.pid
                )
            )
    figures = _summary(per_stream)
    figures["survivor_ready_s"] = survivor_ready_s
    figures["tokens_when_survivor_ready"] = tokens_at_ready
    return figures, survivor


def _summary(per_stream: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"streams": per_stream}
    for key in (*PHASES, "tokens_written_by_victim"):
        values = [p[key] for p in per_stream]
        out[f"{key}_median"] = median(values)
        numbers = [v for v in values if v is not None]
        out[f"{key}_max"] = max(numbers) if numbers else None
    out["incorrect"] = sum(not p["correct"] for p in per_stream)
    out["no_stall_measured"] = sum(p["stall_s"] is None for p in per_stream)
    return out


def run(ctx: Context) -> ScenarioResult:
    s = QUICK if ctx.quick else Sizes()
    leases = Leases.defaults()
    env = {
        "LLMQ_CONCURRENCY": str(s.concurrency),
        "LLMQ_MODEL_TOKENS_PER_SECOND": str(s.tokens_per_second),
        "LLMQ_MODEL_PREFILL_SECONDS_PER_TOKEN": str(s.prefill_seconds_per_token),
    }
    runs: list[dict[str, Any]] = []
    with Stack(ctx.log_dir) as stack:
        stack.scale(1, env)
        victim = stack.workers[0]
        worker_env = clean_env(LLMQ_REDIS_URL=stack.redis.url, **env)
        for i in range(ctx.repeats):
            ctx.say(f"  recovery run {i + 1}/{ctx.repeats}")
            figures, victim = asyncio.run(_repeat(stack, s, victim, worker_env, ctx, i))
            runs.append(figures)
    return _result(ctx, s, leases, runs)


def _result(ctx: Context, s: Sizes, leases: Leases, runs: list[dict[str, Any]]) -> ScenarioResult:
    streams = [p for r in runs for p in r["streams"]]

    def med(key: str) -> float | None:
        return median(r[f"{key}_median"] for r in runs)

    def worst(key: str) -> float | None:
        numbers = [p[key] for p in streams if p[key] is not None]
        return max(numbers) if numbers else None

    summary = {key: {"median": med(key), "max": worst(key)} for key in PHASES}
    replay_model = median(p["replay_model_s"] for p in streams)
    restart_low = leases.lease_seconds - leases.heartbeat_seconds
    restart_high = leases.lease_seconds + leases.sweep_seconds
    restart_bound = leases.lease_seconds + SLACK_S
    incorrect = sum(not p["correct"] for p in streams)
    unmeasured = sum(p["stall_s"] is None or p["restart_s"] is None for p in streams)

    restart_max = summary["restart_s"]["max"]
    restart_target = Target(
        f"dead worker's requests re-run within lease + {SLACK_S:g} s "
        f"({restart_bound:g} s) of the SIGKILL, every stream",
        None if restart_max is None else restart_max <= restart_bound and unmeasured == 0,
        f"restart median {fmt(summary['restart_s']['median'], 2)} s, "
        f"max {fmt(restart_max, 2)} s (arq alone: job_timeout + 10 s)",
    )
    stalls = [p["stall_s"] for p in streams if p["stall_s"] is not None]
    stall_target = Target(
        f"client stall (kill -> next new token) <= lease + {SLACK_S:g} s "
        f"({restart_bound:g} s), every stream: the re-run resumes, it does not regenerate",
        None if not stalls else max(stalls) <= restart_bound and unmeasured == 0,
        f"stall median {fmt(summary['stall_s']['median'], 2)} s, max "
        f"{fmt(summary['stall_s']['max'], 2)} s, of which replay (resumed: prefill + one "
        f"token) {fmt(summary['replay_s']['median'], 2)} s; regenerating would have added "
        f"{fmt(replay_model, 2)} s (median)",
    )
    correct_target = Target(
        "every stream completes with each token exactly once",
        incorrect == 0,
        f"{len(streams) - incorrect}/{len(streams)} streams exact",
    )
    targets = [restart_target, stall_target, correct_target]

    rows = []
    for i, r in enumerate(runs):
        rows.append(
            [
                str(i + 1),
                fmt(r["stall_s_median"], 2),
                fmt(r["stall_s_max"], 2),
                fmt(r["restart_s_median"], 2),
                fmt(r["replay_s_median"], 2),
                fmt(r["relay_s_median"] * 1000 if r["relay_s_median"] is not None else None),
                fmt(r["tokens_written_by_victim_median"], 0),
                f"{len(r['streams']) - r['incorrect']}/{len(r['streams'])}",
            ]
        )
    rows.append(
        [
            "**all runs**",
            fmt(summary["stall_s"]["median"], 2),
            fmt(summary["stall_s"]["max"], 2),
            fmt(summary["restart_s"]["median"], 2),
            fmt(summary["replay_s"]["median"], 2),
            fmt(
                summary["relay_s"]["median"] * 1000
                if summary["relay_s"]["median"] is not None
                else None
            ),
            fmt(median(p["tokens_written_by_victim"] for p in streams), 0),
            f"{len(streams) - incorrect}/{len(streams)}",
        ]
    )
    in_flight = sum(
        p["first_chunk_after_kill_s"] is not None
        and p["stall_s"] is not None
        and p["first_chunk_after_kill_s"] < p["stall_s"]
        for p in streams
    )
    md = "\n\n".join(
        [
            f"{s.streams} streaming `POST /v1/completions` clients, max_tokens {s.max_tokens}, "
            f"mock model {s.tokens_per_second:g} tok/s, all on one worker (concurrency "
            f"{s.concurrency}); a second worker is started and registered, then the first "
            f"is SIGKILLed once every stream has received {s.kill_after_tokens} tokens. "
            f"Worker defaults as used: lease_seconds {leases.lease_seconds:g}, "
            f"heartbeat_seconds {leases.heartbeat_seconds:g}, sweep_seconds "
            f"{leases.sweep_seconds:g}. The survivor registered "
            f"{fmt(median(r['survivor_ready_s'] for r in runs), 2)} s after its start "
            f"(median). {ctx.repeats} run{'s' if ctx.repeats != 1 else ''} (the survivor "
            "of one is the "
            "victim of the next); per run the median over its streams, then the median "
            "of the runs; max over every stream.",
            f"Stall = SIGKILL -> the client receives its first token it did not have yet. "
            f"Restart = kill -> re-run started (expected {restart_low:g}-{restart_high:g} s: "
            f"the last renewal was up to one heartbeat before the kill, plus the sweep "
            f"interval); replay = re-run start -> first new token written (the re-run "
            f"resumes after the tokens already in the stream: it reads them, prefills "
            f"prompt + them and decodes on, so this is a prefill and one token interval, "
            f"not the {fmt(replay_model, 2)} s of regenerating them at model speed); "
            f"relay = written -> "
            f"received (stream ids have 1 ms resolution). In {in_flight} of {len(streams)} "
            "streams, tokens the victim wrote just before dying arrived after the kill: "
            "in flight, not counted as recovery.",
            table(
                [
                    "run",
                    "stall median (s)",
                    "stall max (s)",
                    "restart (s)",
                    "replay (s)",
                    "relay (ms)",
                    "tokens written before kill",
                    "exact streams",
                ],
                rows,
            ),
            *(target_line(t.description, t.met, t.detail) for t in targets),
        ]
    )
    data = {
        "settings": asdict(s),
        "leases": asdict(leases),
        "runs": runs,
        "summary": summary,
        "replay_model_s_median": replay_model,
        "expected_restart_s": [restart_low, restart_high],
        "incorrect_streams": incorrect,
    }
    return ScenarioResult("recovery", "Recovery: a worker SIGKILLed mid-stream", data, md, targets)
