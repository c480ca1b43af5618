"""The checker: a pure function of a campaign's history, one rule per guarantee.

:func:`check` returns every violation found; an empty list means the history is
correct. ``reference(spec)`` gives the tokens an undisturbed run of a request
produces (the mock model for its seed, computed in-process; see
:func:`bench.chaos.campaign.reference`). The rules:

- ``ends``: every accepted request ends (its record is ``done``, ``failed`` or
  ``cancelled``) within ``bound`` seconds of the faults stopping, and no client is
  left hanging;
- ``indices``: a native stream delivers each token index once, in order, across
  its reconnects (``Last-Event-ID``);
- ``text``: every stream's text is a prefix of the undisturbed run's (a cancelled
  or cut stream too); a native ``done`` with ``length`` holds all of it; a native
  request is ``cancelled`` only if its client cancelled it;
- ``usage``: the usage a stream reports equals the tokens it delivered;
- ``complete``: an OpenAI stream that shows ``finish_reason`` ``length``/``stop``
  (and ``[DONE]``) holds the exact text: one that was cut never looks complete;
- ``settled``: nothing is left queued or running;
- ``metrics``: ``llmq_requests_total`` per finished_reason is never above what the
  records say, and below it by no more than the requests that ended within a
  flush interval before a process was killed (its unflushed counts die with it),
  plus submissions whose answer was lost (a batch's lines count as requests that ended
  ``length``, and a line fed again after its feeding API died as an unknown one);
- ``crashes``: no process exited unless the nemesis stopped it;
- ``nemesis``: every fault was healed (a failover that never completes, a process
  that does not come back ready, is the system's failure too);
- ``batch``: every batch run beside the clients completed, every ``custom_id`` is in
  its output exactly once (none missing, none twice, none in the error file: a fault
  fails no line), and each line's text is the undisturbed run's;
- ``quota``: a refusal for a tenant's quota (429) carries ``retry-after``, and once
  everything ended no tenant holds a reservation or a place among its requests at once;
- ``tenant-tokens``: ``llmq_tenant_tokens_total`` of each tenant (what ``llmq tenant
  stats`` shows) is the sum of prompt + completion tokens over its requests' records
  (a request cancelled while queued counts none; a batch line by its output's usage),
  less no more than the counts a killed process took with it (a request or batch line
  whose record says it finished within a flush interval before the kill), more by
  no more than submissions whose id was lost;
- ``wait``: no request of a tenant below its share waited longer than
  ``history.wait_bound`` for its first token, unless its wait overlapped a fault that
  stops every request (Redis, an API killed, stopped or cut off, every worker killed);
- ``graceful``: a request whose life overlapped only graceful stops (SIGTERM of a
  worker or an API, a rolling restart) ends well: native ``done`` with all its tokens;
  OpenAI ``[DONE]`` with the exact text, or, if its own API process was stopped while
  it streamed, the documented ``shutting_down`` error chunk and ``[DONE]`` after the
  API's shutdown grace (the request is to be retried); a refusal only for a quota.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from bench.chaos.history import BatchRun, History, Request, Spec

Reference = Callable[[Spec], list[str]]

TERMINAL = ("done", "failed", "cancelled")
COMPLETE = ("length", "stop")
#: Outcomes the metrics count, by the record's finish_reason.
REASONS = ("length", "stop", "cancelled", "timeout", "error")
#: Fault kinds that kill a process (its unflushed metrics are lost with it).
KILLING = ("worker-kill", "all-workers-kill", "api-kill", "redis-stall-worker-kill")
#: Graceful stops (SIGTERM): no request may fail for them.
GRACEFUL = ("worker-term", "api-term", "rolling-restart")
#: Fault kinds that cost a request at most what one worker's loss costs (its lease,
#: or its drain, and a sweep): the ``wait`` bound holds across them; every other kind
#: stops every request for as long as the nemesis holds it.
ONE_WORKER = ("worker-kill", "worker-pause", "worker-partition", *GRACEFUL)
#: The error code of a stream an API process ended as it stopped (api/streams/follow.py).
SHUTTING_DOWN = "shutting_down"
#: The most prompt tokens a campaign request has (its prompt is a short sentence).
PROMPT_TOKENS_AT_MOST = 64
#: Batch lines a killed feeder may have enqueued without noting them (fed again, so
#: run and counted twice): what one feeder step feeds, the pool's slots and lookahead.
BATCH_REFED_PER_KILL = 20


@dataclass(frozen=True)
class Violation:
    rule: str
    request: int | None
    message: str

    def __str__(self) -> str:
        where = f"request {self.request}: " if self.request is not None else ""
        return f"[{self.rule}] {where}{self.message}"


def check(history: History, reference: Reference) -> list[Violation]:
    """Every violation of the rules above in ``history``."""
    found: list[Violation] = []
    for request in history.requests:
        ref = reference(request.spec)
        mine = _ends(history, request)
        if request.spec.kind == "native":
            mine += _native(request, ref)
        else:
            mine += _openai(request, ref)
        found += [Violation(v.rule, v.request, f"{v.message} ({_describe(request)})") for v in mine]
    if history.nemesis_error:
        found.append(Violation("nemesis", None, f"a fault did not heal: {history.nemesis_error}"))
    found += _settled(history)
    found += _metrics(history)
    found += _crashes(history)
    for run in history.batches:
        found += _batch(run, reference)
    found += _quota(history)
    found += _tenant_tokens(history)
    found += _wait(history)
    found += _graceful(history)
    return found


def _ends(history: History, r: Request) -> list[Violation]:
    n = r.spec.n
    if r.outcome == "hung":
        return [Violation("ends", n, f"the client was still waiting {history.bound:g} s after")]
    if r.request_id is None:
        return []
    status = r.record.get("status")
    if status not in TERMINAL:
        return [Violation("ends", n, f"{r.request_id} never ended (status {status!r})")]
    if r.settled_after is None or r.settled_after > history.bound:
        return [Violation("ends", n, f"{r.request_id} ended {r.settled_after} s after the faults")]
    return []


def delivered(text: str, ref: list[str]) -> int | None:
    """How many reference tokens ``text`` is, or None if it is not a prefix of them."""
    joined = ""
    for k, token in enumerate(ref):
        if joined == text:
            return k
        joined += token
        if not text.startswith(joined):
            return None
    return len(ref) if joined == text else None


def _native(r: Request, ref: list[str]) -> list[Violation]:
    n, out = r.spec.n, []
    indices = r.indices()
    if indices != list(range(len(indices))):
        out.append(Violation("indices", n, f"indices not once each in order: {_short(indices)}"))
        return out
    tokens = r.tokens()
    if tokens != ref[: len(tokens)]:
        out.append(Violation("text", n, f"text differs from the undisturbed run: {tokens[:8]}"))
        return out
    if r.outcome == "done" and r.finish_reason in COMPLETE and len(tokens) != len(ref):
        message = f"done with {r.finish_reason} after {len(tokens)} of {len(ref)} tokens"
        out.append(Violation("text", n, message))
    if r.finish_reason == "cancelled" and not r.cancelled:
        out.append(Violation("text", n, "cancelled, though its client never cancelled it"))
    if r.usage_tokens is not None and r.usage_tokens != len(tokens):
        message = f"usage says {r.usage_tokens} tokens, {len(tokens)} were delivered"
        out.append(Violation("usage", n, message))
    return out


def _openai(r: Request, ref: list[str]) -> list[Violation]:
    n, out = r.spec.n, []
    count = delivered(r.text, ref)
    if count is None:
        out.append(
            Violation("text", n, f"text is not a prefix of the undisturbed run: {r.text!r:.80}")
        )
        return out
    if r.finish_reason in COMPLETE and count != len(ref):
        message = f"shows finish_reason {r.finish_reason} with {count} of {len(ref)} tokens"
        out.append(Violation("complete", n, message))
    if r.outcome == "done" and r.finish_reason in COMPLETE and r.text != "".join(ref):
        out.append(Violation("complete", n, "[DONE] with a text that is not the exact text"))
    if r.usage_tokens is not None and r.usage_tokens != count:
        message = f"usage says {r.usage_tokens} tokens, {count} were delivered"
        out.append(Violation("usage", n, message))
    return out


def _settled(history: History) -> list[Violation]:
    if history.queued or history.running:
        message = f"{history.queued} queued and {history.running} running after the campaign"
        return [Violation("settled", None, message)]
    return []


def _reason(r: Request) -> str | None:
    status = r.record.get("status")
    if status == "cancelled":
        return "cancelled"
    if status in ("done", "failed"):
        return r.record.get("finish_reason") or "error"
    return None


def _metrics(history: History) -> list[Violation]:
    recorded = Counter(
        reason for r in history.requests if r.request_id and (reason := _reason(r)) is not None
    )
    at_risk: Counter[str] = Counter()
    for r in history.requests:
        reason = _reason(r)
        if reason is not None and _at_risk(history, r):
            at_risk[reason] += 1
    # submissions whose id the client never learnt may have run and been counted
    unknown = sum(_lost(r) for r in history.requests)
    # batch lines are requests too, each counted once...
    recorded["length"] += sum(len(run.output) for run in history.batches)
    at_risk["length"] += sum(len(_lines_before_kill(history, run)) for run in history.batches)
    # ...but for those a killed feeding API had enqueued without noting it yet
    unknown += _refed(history)
    out = []
    for reason in REASONS:
        counted = history.counters.get(reason, 0.0)
        want = recorded[reason]
        if counted > want + unknown:
            out.append(Violation("metrics", None, f"{counted:g} counted {reason}, {want} ended so"))
        elif want - counted > at_risk[reason]:
            message = (
                f"{counted:g} counted {reason}, {want} ended so "
                f"({at_risk[reason]} ended just before a process was killed)"
            )
            out.append(Violation("metrics", None, message))
    return out


def _at_risk(history: History, r: Request) -> bool:
    """Whether ``r`` ended within a flush interval before a process was killed (the
    counts of its end may have died with it)."""
    return _ended_before_kill(history, _finished_at(history, r))


def _ended_before_kill(history: History, ended: float | None) -> bool:
    """Whether a request that ended at ``ended`` (campaign seconds) did so within a
    flush interval before a process was killed."""
    if ended is None:
        return False
    window = history.flush_seconds + 0.5
    kills = [f.started_at for f in history.faults if f.kind in KILLING]
    return any(ended - 0.5 <= k <= ended + window for k in kills)


def _lines_before_kill(history: History, run: BatchRun) -> list[int]:
    """The tokens of each of the run's output lines whose request ended within a flush
    interval before a process was killed (as :func:`_at_risk`, by its record)."""
    return [
        tokens
        for request_id, tokens in run.line_tokens
        if _ended_before_kill(history, run.finished.get(request_id))
    ]


def _lost(r: Request) -> bool:
    """A submission whose id the client never learnt: it may have run, unseen."""
    return r.request_id is None and r.outcome != "refused"


def _refed(history: History) -> int:
    """Batch lines that may have run twice: those a killed feeding API had enqueued
    without noting them (fed again)."""
    if not history.batches:
        return 0
    return sum(f.kind == "api-kill" for f in history.faults) * BATCH_REFED_PER_KILL


def _finished_at(history: History, r: Request) -> float | None:
    """When the request's record says it finished, in campaign seconds."""
    try:
        return float(r.record["finished_at"]) - history.started_unix
    except (KeyError, ValueError):
        return None


def _crashes(history: History) -> list[Violation]:
    return [
        Violation("crashes", None, f"{p.name} (pid {p.pid}) exited {p.exit_code}: {p.log_tail}")
        for p in history.processes
        if p.exit_code is not None and not p.by_nemesis
    ]


def batch_custom_id(spec: Spec) -> str:
    return f"line-{spec.n}"


def _batch(run: BatchRun, reference: Reference) -> list[Violation]:
    if run.error or run.status != "completed":
        return [Violation("batch", None, f"{run.batch_id} ended {run.status!r}: {run.error}")]
    out = [
        Violation("batch", None, f"line {custom_id} failed: {code}")
        for custom_id, code in run.errors
    ]
    seen = Counter(custom_id for custom_id, _ in run.output)
    out += [
        Violation("batch", None, f"line {custom_id} is in the output {count} times")
        for custom_id, count in seen.items()
        if count > 1
    ]
    texts = dict(run.output)
    for spec in run.specs:
        custom_id = batch_custom_id(spec)
        if custom_id not in texts:
            if custom_id not in dict(run.errors):
                out.append(Violation("batch", None, f"line {custom_id} is missing"))
            continue
        if texts[custom_id] != "".join(reference(spec)):
            message = f"line {custom_id}'s text differs: {texts[custom_id]!r:.80}"
            out.append(Violation("batch", None, message))
    unknown = set(texts) - {batch_custom_id(spec) for spec in run.specs}
    if unknown:
        out.append(Violation("batch", None, f"lines nobody asked for: {sorted(unknown)[:5]}"))
    return out


def _quota(history: History) -> list[Violation]:
    out = [
        Violation("quota", r.spec.n, f"refused 429 without retry-after ({_describe(r)})")
        for r in history.requests
        if r.refused_status == 429 and r.retry_after is None
    ]
    for tenant, held in sorted(history.quotas.items()):
        left = {name: count for name, count in held.items() if count}
        if left:
            out.append(Violation("quota", None, f"tenant {tenant} still holds {left} at the end"))
    return out


def _tokens(r: Request) -> int:
    return int(r.record.get("prompt_tokens") or 0) + int(r.record.get("completion_tokens") or 0)


def _tenant_tokens(history: History) -> list[Violation]:
    """Each tenant's counted tokens against its records: at least those of requests that
    ran to an end (done, failed), less those a killed process may not have flushed; at
    most those plus what cancelled requests used and lost submissions could have."""
    if not history.tenant_tokens and not history.quotas:
        return []  # a campaign without tenants
    least: Counter[str] = Counter()
    most: Counter[str] = Counter()
    risk: Counter[str] = Counter()
    for r in history.requests:
        tenant = r.spec.tenant or "default"
        if _lost(r):
            most[tenant] += PROMPT_TOKENS_AT_MOST + r.spec.max_tokens
            continue
        status = r.record.get("status")
        if status not in TERMINAL:
            continue
        tokens = _tokens(r)
        most[tenant] += tokens
        if status != "cancelled":  # one cancelled while queued counts none
            least[tenant] += tokens
        if _at_risk(history, r):
            risk[tenant] += tokens
    for run in history.batches:
        least["default"] += run.tokens
        most["default"] += run.tokens
        line_most = PROMPT_TOKENS_AT_MOST + max((s.max_tokens for s in run.specs), default=0)
        most["default"] += _refed(history) * line_most
        risk["default"] += sum(_lines_before_kill(history, run))
    out = []
    for tenant in sorted({*least, *most, *history.tenant_tokens}):
        counted = history.tenant_tokens.get(tenant, 0.0)
        if counted > most[tenant]:
            message = f"tenant {tenant}: {counted:g} tokens counted, its records say {most[tenant]}"
            out.append(Violation("tenant-tokens", None, message))
        elif counted < least[tenant] - risk[tenant]:
            message = (
                f"tenant {tenant}: {counted:g} tokens counted, its records say {least[tenant]} "
                f"({risk[tenant]} ended just before a process was killed)"
            )
            out.append(Violation("tenant-tokens", None, message))
    return out


def _overlaps(history: History, start: float, end: float, kinds: Callable[[str], bool]) -> bool:
    """Whether a fault of a kind ``kinds`` accepts, or its tail, overlaps [start, end]."""
    return any(
        kinds(f.kind)
        and f.started_at <= end
        and start <= (f.ended_at if f.ended_at is not None else end) + history.fault_tail
        for f in history.faults
    )


def _wait(history: History) -> list[Violation]:
    out = []
    for r in history.requests:
        if r.spec.tenant not in history.below_share or r.request_id is None:
            continue
        if r.cancelled or r.outcome == "refused":
            continue
        first = r.first_token_at if r.first_token_at is not None else r.ended_at
        if first is None or first - r.submitted_at <= history.wait_bound:
            continue
        if _overlaps(history, r.submitted_at, first, lambda kind: kind not in ONE_WORKER):
            continue  # a fault that stops everything: its hold is the nemesis's choice
        message = (
            f"tenant {r.spec.tenant} waited {first - r.submitted_at:.2f} s for its first "
            f"token, bound {history.wait_bound:g} s ({_describe(r)})"
        )
        out.append(Violation("wait", r.spec.n, message))
    return out


def _stopped_apis(history: History, start: float, end: float) -> set[str]:
    """The API URLs a graceful stop ended while [start, end]."""
    return {
        url
        for f in history.faults
        if f.kind in GRACEFUL and f.started_at <= end and start <= (f.ended_at or end)
        for url in f.detail.get("apis", [])
    }


def _graceful(history: History) -> list[Violation]:
    out = []
    for r in history.requests:
        end = r.ended_at if r.ended_at is not None else r.submitted_at
        if r.cancelled or not _overlaps(history, r.submitted_at, end, GRACEFUL.__contains__):
            continue
        if _overlaps(history, r.submitted_at, end, lambda kind: kind not in GRACEFUL):
            continue
        if r.outcome == "refused" and r.refused_status == 429:
            continue  # a quota, not the stop
        if r.outcome == "done" and r.finish_reason in COMPLETE:
            continue  # the rules above check that it holds all its tokens
        if (
            r.spec.kind == "openai"
            and r.outcome == "error"
            and r.error_code == SHUTTING_DOWN
            and r.api in _stopped_apis(history, r.submitted_at, end)
        ):
            continue  # the documented end of a stream its API stopped relaying
        message = f"failed across a graceful stop: {r.error or r.outcome} ({_describe(r)})"
        out.append(Violation("graceful", r.spec.n, message))
    return out


def _describe(r: Request) -> str:
    """Who the request was, for a person replaying it."""
    cancel = f", cancels at {r.spec.cancel_after:.1f} s" if r.spec.cancel_after else ""
    return (
        f"{r.spec.kind} {r.request_id}, {r.spec.max_tokens} tokens{cancel}; client saw "
        f"{r.outcome}/{r.finish_reason}; record {r.record.get('status')}/"
        f"{r.record.get('finish_reason')} attempts {r.record.get('attempts')}"
    )


def _short(indices: list[int]) -> str:
    wrong = next((k for k, i in enumerate(indices) if i != k), 0)
    return f"at position {wrong}: {indices[max(0, wrong - 3) : wrong + 4]}"
