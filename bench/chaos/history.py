"""What a campaign records: each request as its client saw it, each fault, each
process, and the system's state once the faults stopped.

Plain dataclasses that round-trip through JSON (:func:`to_json`, :func:`from_json`),
so a campaign's history can be saved and checked again, and the checker's unit
tests can build histories by hand. Times are seconds since the campaign started.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Kind = Literal["native", "openai"]

#: How a client's request ended, as the client saw it.
#: ``done``: a terminal ``done`` event (native) or ``[DONE]`` (OpenAI);
#: ``error``: a terminal ``error`` event or an OpenAI error chunk or status;
#: ``cut``: the connection broke (OpenAI) or the client gave up reconnecting (native);
#: ``refused``: never accepted (429/503, or no API answered);
#: ``unknown``: the submission's answer was lost, so its id is unknown;
#: ``hung``: still open when the campaign's bound ran out.
Outcome = Literal["done", "error", "cut", "refused", "unknown", "hung"]


@dataclass
class Spec:
    """What a client asks: ``max_tokens`` with ``ignore_eos``, so the expected text
    is exactly ``max_tokens`` tokens of the mock for ``seed``."""

    n: int
    kind: Kind
    seed: int
    prompt: str
    max_tokens: int
    #: Cancel (native: DELETE; OpenAI: close the connection) this long after submitting.
    cancel_after: float | None = None
    #: The tenant it is sent for (the ``X-Tenant`` header; "": none, the default tenant).
    tenant: str = ""


@dataclass
class Request:
    """One client's request and what it received."""

    spec: Spec
    submitted_at: float
    request_id: str | None = None
    outcome: Outcome | None = None
    ended_at: float | None = None
    #: Native: token events as received, ``(index, tokens)``, across reconnects.
    events: list[tuple[int, list[str]]] = field(default_factory=list)
    #: OpenAI: the text received, and the ``finish_reason`` of the last choice.
    text: str = ""
    finish_reason: str | None = None
    #: The usage the stream reported (its ``completion_tokens``), if any.
    usage_tokens: int | None = None
    #: The client cancelled (a DELETE answered, or it closed the connection).
    cancelled: bool = False
    reconnects: int = 0
    #: The API it was accepted by (OpenAI: the one that streamed it).
    api: str = ""
    #: When its first token arrived (None: none did).
    first_token_at: float | None = None
    #: A refusal's HTTP status, and its ``retry-after`` header (None: it had none).
    refused_status: int | None = None
    retry_after: str | None = None
    #: The code of the error event or chunk that ended it (``shutting_down``, ...).
    error_code: str = ""
    #: Longest wait between two token arrivals (or from submitting to the first).
    stall: float = 0.0
    #: The request's record once the faults stopped: status, finish_reason, ...
    record: dict[str, str] = field(default_factory=dict)
    #: Seconds after the faults stopped when its record was terminal (None: never).
    settled_after: float | None = None
    error: str = ""

    def tokens(self) -> list[str]:
        """Native: the tokens received, in arrival order."""
        return [t for _, chunk in self.events for t in chunk]

    def indices(self) -> list[int]:
        return [i + k for i, chunk in self.events for k in range(len(chunk))]


@dataclass
class Fault:
    kind: str
    targets: list[str]
    started_at: float
    ended_at: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Process:
    """A process of the stack: how it ended, and whether the nemesis ended it."""

    name: str
    pid: int
    exit_code: int | None
    by_nemesis: bool
    log_tail: str = ""


@dataclass
class BatchRun:
    """A batch run through the Batch API beside the clients: its lines (``custom_id``
    ``line-<n>``, each a completion of ``spec``) and what its output and error files
    held once it ended, line by line as listed (a ``custom_id`` twice is kept twice)."""

    specs: list[Spec] = field(default_factory=list)
    batch_id: str = ""
    status: str = ""
    #: ``(custom_id, text)`` of each output line.
    output: list[tuple[str, str]] = field(default_factory=list)
    #: ``(custom_id, error code or status)`` of each error line.
    errors: list[tuple[str, str]] = field(default_factory=list)
    #: Why the batch could not be made or read back.
    error: str = ""
    #: When it was made and when it was seen ended (campaign seconds).
    created_at: float = 0.0
    ended_at: float | None = None
    #: Prompt + completion tokens its output lines' usage says.
    tokens: int = 0
    #: ``(request id, prompt + completion tokens)`` of each output line.
    line_tokens: list[tuple[str, int]] = field(default_factory=list)
    #: When each output line's request record says it finished (campaign seconds), by
    #: request id: the tokens of a line that ended just before a kill may be uncounted.
    finished: dict[str, float] = field(default_factory=dict)


@dataclass
class History:
    seed: int
    duration: float
    #: Unix time of the campaign's start (records carry Unix times).
    started_unix: float = 0.0
    requests: list[Request] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    processes: list[Process] = field(default_factory=list)
    #: When the last fault was healed (every process running, every link up).
    quiet_at: float = 0.0
    #: Seconds after ``quiet_at`` within which every request must have ended.
    bound: float = 60.0
    #: Left in the model's queue and running set once everything settled.
    queued: int = 0
    running: int = 0
    #: ``llmq_requests_total`` by finished_reason, and other counters, at the end.
    counters: dict[str, float] = field(default_factory=dict)
    #: Tokens runs generated after losing their lease (``llmq_lease_lost_tokens_total``).
    lease_lost_tokens: float = 0.0
    #: How long a process may hold a count before flushing it (lost if it is killed).
    flush_seconds: float = 1.0
    #: A fault the nemesis could not inject or heal (the system did not come back).
    nemesis_error: str = ""
    #: The batches run beside the clients, one after another throughout.
    batches: list[BatchRun] = field(default_factory=list)
    #: Each tenant's quota state at the end: ``reserved`` (reservations left) and
    #: ``inflight`` (places among its requests at once left).
    quotas: dict[str, dict[str, int]] = field(default_factory=dict)
    #: ``llmq_tenant_tokens_total`` by tenant at the end (what ``llmq tenant stats`` shows).
    tenant_tokens: dict[str, float] = field(default_factory=dict)
    #: Tenants that ask less than their share: none of their requests waits longer than
    #: ``wait_bound`` seconds for its first token, but for a fault that stops everything.
    below_share: list[str] = field(default_factory=list)
    wait_bound: float = 0.0
    #: How long after a fault its effects may still be felt (a killed worker's leases).
    fault_tail: float = 3.0


def to_json(history: History) -> str:
    return json.dumps(asdict(history))


def from_json(text: str) -> History:
    raw = json.loads(text)
    requests = []
    for r in raw.pop("requests"):
        spec = Spec(**r.pop("spec"))
        events = [(int(i), list(t)) for i, t in r.pop("events")]
        requests.append(Request(spec=spec, events=events, **r))
    faults = [Fault(**f) for f in raw.pop("faults")]
    processes = [Process(**p) for p in raw.pop("processes")]
    batches = [
        BatchRun(
            specs=[Spec(**spec) for spec in b.pop("specs")],
            output=[(str(c), str(t)) for c, t in b.pop("output")],
            errors=[(str(c), str(e)) for c, e in b.pop("errors")],
            line_tokens=[(str(r), int(t)) for r, t in b.pop("line_tokens", [])],
            **b,
        )
        for b in raw.pop("batches")
    ]
    return History(requests=requests, faults=faults, processes=processes, batches=batches, **raw)
