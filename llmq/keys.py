"""Every Redis key and channel name llmq uses, in one place.

Queues are arq queues (a sorted set per model); jobs live under arq's own key
prefixes so that arq's worker machinery (tries, in-progress markers) works on them.
"""

from __future__ import annotations

from arq.constants import in_progress_key_prefix, job_key_prefix, retry_key_prefix

from llmq import codec

PREFIX = "llmq"

#: Sorted set of live worker ids, scored by their last heartbeat (ms).
WORKERS = f"{PREFIX}:workers"

#: The lifecycle stream: one entry per request state change (see llmq.schema.Lifecycle).
LIFECYCLE = f"{PREFIX}:lifecycle"

#: Sorted set of live API process ids, scored by when they count as dead (ms): the
#: OpenAI requests attached to a process that stopped renewing this get cancelled.
APIS = f"{PREFIX}:apis"

#: Sorted set of queued requests' deadlines (member ``<id>:<model>``, score ms).
DEADLINES = f"{PREFIX}:deadlines"

#: The lease clock (hash: ``real`` ms last seen, ``lease`` ms): the time that every
#: lease is set and judged by, kept in Redis (see ``llmq/lua/clock.lua``).
CLOCK = f"{PREFIX}:clock"

QUEUE_PREFIX = f"{PREFIX}:queue:"
COSTS_PREFIX = f"{PREFIX}:costs:"
CANCEL_FLAG_PREFIX = f"{PREFIX}:cancelled:"
ATTACHED_PREFIX = f"{PREFIX}:attached:"

# arq's prefixes, re-exported so that no other module spells them.
JOB_PREFIX: str = job_key_prefix
IN_PROGRESS_PREFIX: str = in_progress_key_prefix
RETRY_PREFIX: str = retry_key_prefix


def queue(model: str) -> str:
    """The arq queue (sorted set of request ids, scored by effective start time)."""
    return f"{QUEUE_PREFIX}{model}"


def leases(model: str) -> str:
    """Hash of running request id -> lease "score:cost:attempt" (:class:`llmq.codec.Lease`):
    where to requeue it if its worker dies, and which attempt holds it."""
    return f"{PREFIX}:leases:{model}"


def costs(model: str) -> str:
    """Hash of queued request id -> prompt + max_tokens (token-aware admission)."""
    return f"{COSTS_PREFIX}{model}"


def deadline_member(request_id: str, model: str) -> str:
    return codec.deadline_member(request_id, model)


def attached(process_id: str) -> str:
    """Set of ``<id>:<model>`` of OpenAI requests whose client is connected to this API
    process: nobody can resume them, so they are cancelled if the process dies."""
    return f"{ATTACHED_PREFIX}{process_id}"


def cancel_flag(request_id: str) -> str:
    """Set (with a TTL) when a request that was not queued any more is cancelled."""
    return f"{CANCEL_FLAG_PREFIX}{request_id}"


def cancel_channel(model: str) -> str:
    """Pub/sub channel that tells the model's workers to stop a request."""
    return f"{PREFIX}:cancel:{model}"


def running(model: str) -> str:
    """Sorted set of the model's running request ids, scored by lease expiry (ms)."""
    return f"{PREFIX}:running:{model}"


def wake(model: str) -> str:
    """Pub/sub channel that tells idle workers of the model that work arrived."""
    return f"{PREFIX}:wake:{model}"


def parked(model: str) -> str:
    """Sorted set of the model's parked workers (a free slot, nothing queued for them),
    scored by when they parked: the longest-waiting is handed the next request."""
    return f"{PREFIX}:parked:{model}"


def parked_terms(model: str) -> str:
    """Hash of parked worker id -> "free|budget|idle|lease ms|in-progress ms"."""
    return f"{PREFIX}:parked-terms:{model}"


HANDOFF_PREFIX = f"{PREFIX}:handoff:"


def handoff(worker_id: str) -> str:
    """Pub/sub channel on which one worker is handed requests claimed for it."""
    return f"{HANDOFF_PREFIX}{worker_id}"


def job(request_id: str) -> str:
    """arq's job record: the serialized :class:`~llmq.schema.JobPayload`."""
    return f"{JOB_PREFIX}{request_id}"


def in_progress(request_id: str) -> str:
    return f"{IN_PROGRESS_PREFIX}{request_id}"


def retry(request_id: str) -> str:
    return f"{RETRY_PREFIX}{request_id}"


FENCE_PREFIX = f"{PREFIX}:fence:"


def fence(request_id: str) -> str:
    """Hash guarding the request's writes (``llmq/lua/publish.lua``): ``attempt``, the
    lowest attempt allowed to write; ``next``, the stream's next token index;
    ``ended``, '1' once a terminal event is written."""
    return f"{FENCE_PREFIX}{request_id}"


def request(request_id: str) -> str:
    """Hash holding the request's status and timings (:class:`~llmq.schema.RequestRecord`)."""
    return f"{PREFIX}:req:{request_id}"


def stream(request_id: str) -> str:
    """The request's token stream (events of :mod:`llmq.schema`)."""
    return f"{PREFIX}:stream:{request_id}"


def worker(worker_id: str) -> str:
    """A worker's registry entry (:class:`~llmq.schema.WorkerInfo` JSON, short TTL)."""
    return f"{PREFIX}:worker:{worker_id}"


def control(process_id: str) -> str:
    """A tiny stream that wakes one API process's relay when it gains a subscriber."""
    return f"{PREFIX}:ctl:{process_id}"


METRICS_PREFIX = f"{PREFIX}:metrics:"


def metric(family: str) -> str:
    """Hash of a metric family's cluster-wide totals (see :mod:`llmq.metrics`)."""
    return f"{METRICS_PREFIX}{family}"


def metrics_second(unix_second: int) -> str:
    """Hash of counter totals flushed during one second (short TTL): recent rates."""
    return f"{PREFIX}:metrics-second:{unix_second}"


#: The autoscaler's leader lease: the id of the one controller that may act (PX TTL).
AUTOSCALER_LEADER = f"{PREFIX}:autoscaler:leader"

#: Hash of model -> the autoscaler's published state (:class:`~llmq.schema.ScaleState`
#: JSON), renewed every control period and expiring with the controller: while a
#: model's entry is fresh, the API accepts its requests with no live worker.
AUTOSCALER_STATE = f"{PREFIX}:autoscaler:state"
