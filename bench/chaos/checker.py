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
- ``batch``: a batch run beside the clients completed, every ``custom_id`` is in its
  output exactly once (none missing, none twice, none in the error file), and each
  line's text is the undisturbed run's.
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
    found += _batch(history, reference)
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
    kills = [f.started_at for f in history.faults if f.kind in KILLING]
    window = history.flush_seconds + 0.5
    at_risk: Counter[str] = Counter()
    for r in history.requests:
        reason, ended = _reason(r), _finished_at(history, r)
        if reason is None or ended is None:
            continue
        if any(ended - 0.5 <= k <= ended + window for k in kills):
            at_risk[reason] += 1
    # submissions whose id the client never learnt may have run and been counted
    unknown = sum(r.request_id is None and r.outcome != "refused" for r in history.requests)
    if history.batch is not None:  # its lines are requests too, each counted once...
        recorded["length"] += len(history.batch.output)
        # ...but for those a killed feeding API had enqueued without noting it yet
        api_kills = sum(f.kind == "api-kill" for f in history.faults)
        unknown += api_kills * BATCH_REFED_PER_KILL
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


def _batch(history: History, reference: Reference) -> list[Violation]:
    run: BatchRun | None = history.batch
    if run is None:
        return []
    if run.error or run.status != "completed":
        return [Violation("batch", None, f"the batch ended {run.status!r}: {run.error}")]
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
