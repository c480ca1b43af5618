"""Every Redis key and channel name llmq uses, in one place, laid out for Redis Cluster.

A Redis Cluster runs a script or transaction only when all its keys hash to one
slot, and a key's slot is that of its *hash tag* (the text between the first
``{`` and the next ``}``). Every key a script touches carries one of five tags, chosen
so that each script touches a single slot (``tests/test_cluster_slots.py`` checks it):

- the **model slot** ``{m:<model>}``: the model's queue and everything a claim,
  hand-off, renewal, reap, requeue, cancel or deadline sweep changes with it (costs,
  leases, running, parked workers, deadlines, its lease clock and worker beats,
  arq's job, try and in-progress keys of its requests, the cancel flags) and its
  wake, cancel and hand-off channels. A model's queue order is exact because it is
  one slot; a model is as hot as one shard can carry.
- the **request slot** ``{r:<k>}``, ``k`` = crc32 of the request id modulo
  :data:`REQUEST_GROUPS`: the request's stream, record and fence, and the lifecycle
  stream of its group, so that publish.lua writes a request's events and its
  lifecycle notes fenced, in one step. Token traffic, the bulk of all writes,
  spreads over the cluster by request id. Readers of the lifecycle read all
  :data:`LIFECYCLES`.
- the **global slot** ``{g}``: API processes, attached requests, the worker
  registry and its lease clock, and the set of models that have ever queued
  (the sweep's list).
- the **tenant slot** ``{t:<tenant>}``: a tenant's settings and its quota state
  (token and request buckets, requests at once, reservations), so that one script
  takes or returns a tenant's quota atomically.
- the **metrics slot** ``{metrics}``: the metric totals, the per-second counter
  totals and the flush markers, so that one process's flush is one script call.

The few keys no script touches (the autoscaler's lease and state, a single Redis's
relay control streams) carry none. On a single Redis the tags change nothing but
the names. Public request ids never contain braces: the tag is added by these
functions, never by the client.
"""

from __future__ import annotations

import zlib
from functools import lru_cache

from arq.constants import in_progress_key_prefix, job_key_prefix, retry_key_prefix

from llmq.protocol import codec

PREFIX = "llmq"

#: How many request groups (request slots) there are. Fixed: every process must
#: agree on a request's group. 64 spreads requests over up to 64 shards.
REQUEST_GROUPS = 64

#: The global slot's tag.
GLOBAL = "{g}"

#: Sorted set of live worker ids, scored by their last heartbeat (ms, registry clock).
WORKERS = f"{PREFIX}:{GLOBAL}:workers"

#: Sorted set of live API process ids, scored by when they count as dead (ms): the
#: OpenAI requests attached to a process that stopped renewing this get cancelled.
APIS = f"{PREFIX}:{GLOBAL}:apis"

#: The lease clock of the global slot (API and worker registry leases); each model
#: slot has its own (:func:`clock`). A hash: ``real`` ms last seen, ``lease`` ms
#: (see ``llmq/protocol/lua/clock.lua``).
CLOCK = f"{PREFIX}:{GLOBAL}:clock"

#: Set of every model a request was queued for: whose deadlines the sweep checks.
MODELS = f"{PREFIX}:{GLOBAL}:models"

ATTACHED_PREFIX = f"{PREFIX}:{GLOBAL}:attached:"

#: Set of every tenant's name (:mod:`llmq.tenants`).
TENANTS = f"{PREFIX}:{GLOBAL}:tenants"

#: Hash of API key digest -> the key's entry (:class:`llmq.tenants.KeyEntry`, JSON):
#: a key itself is never stored.
API_KEYS = f"{PREFIX}:{GLOBAL}:api-keys"

#: Hash of admin key digest -> the key's entry (:class:`llmq.admin.AdminKey`, JSON):
#: the operator's keys (``llmq key create --admin``), apart from every tenant's.
ADMIN_KEYS = f"{PREFIX}:{GLOBAL}:admin-keys"

#: Hash of the pool policy (:mod:`llmq.policy`): ``version`` (a counter, raised by every
#: change), ``pool`` (the pool-wide document, JSON) and ``model:<name>`` (a model's
#: overrides, JSON). Changed only by ``lua/policy_write.lua``.
POLICY = f"{PREFIX}:{GLOBAL}:policy"

#: Stream of the policy's changes (version, who, what), capped.
POLICY_HISTORY = f"{PREFIX}:{GLOBAL}:policy-history"

#: The prefix of a model's name in :data:`POLICY`.
POLICY_MODEL = "model:"

# arq's prefixes, re-exported so that no other module spells them.
JOB_PREFIX: str = job_key_prefix
IN_PROGRESS_PREFIX: str = in_progress_key_prefix
RETRY_PREFIX: str = retry_key_prefix


def model_tag(model: str) -> str:
    """The hash tag of a model's slot."""
    return f"{{m:{model}}}"


def request_group(request_id: str) -> int:
    """The request group of ``request_id``: the same in every process."""
    return zlib.crc32(request_id.encode()) % REQUEST_GROUPS


def group_tag(group: int) -> str:
    """The hash tag of a request group's slot."""
    return f"{{r:{group}}}"


def request_tag(request_id: str) -> str:
    """The hash tag of a request's slot (that of its group)."""
    return group_tag(request_group(request_id))


# --- the tenant slot ---------------------------------------------------------------


def _in_tenant(name: str, tenant: str) -> str:
    return f"{PREFIX}:{name}:{{t:{tenant}}}"


def tenant(name: str) -> str:
    """A tenant's settings (:class:`llmq.tenants.Tenant`, as JSON in field ``spec``)."""
    return _in_tenant("tenant", name)


def quota_keys(tenant: str) -> tuple[str, str, str, str]:
    """KEYS of the quota scripts (``quota_take.lua``, ``quota_return.lua``): the
    tenant's token bucket and request bucket (hashes ``level``, ``ms``), its requests
    at once (sorted set of request ids, scored by when the hold lapses, ms) and its
    reservations (hash of request id -> tokens reserved)."""
    tpm, rpm, inflight, reserved = (
        _in_tenant(n, tenant) for n in ("tpm", "rpm", "inflight", "reserved")
    )
    return tpm, rpm, inflight, reserved


# --- the model slot ---------------------------------------------------------------


def _in_model(name: str, model: str) -> str:
    return f"{PREFIX}:{name}:{model_tag(model)}"


def queue(model: str) -> str:
    """The arq queue (sorted set of request ids, scored by effective start time)."""
    return _in_model("queue", model)


def leases(model: str) -> str:
    """Hash of running request id -> lease "score:cost:attempt"
    (:class:`llmq.protocol.codec.Lease`): where to requeue it if its worker dies, and
    which attempt holds it."""
    return _in_model("leases", model)


def costs(model: str) -> str:
    """Hash of queued request id -> prompt + max_tokens (token-aware admission)."""
    return _in_model("costs", model)


def deadlines(model: str) -> str:
    """Sorted set of the model's queued request ids, scored by queue deadline (ms)."""
    return _in_model("deadlines", model)


def clock(model: str) -> str:
    """The model slot's lease clock: every lease of the model's requests is set and
    judged by it (``llmq/protocol/lua/clock.lua``)."""
    return _in_model("clock", model)


def beats(model: str) -> str:
    """Sorted set of the model's worker ids, scored by their last lease renewal in the
    model's lease time: the hand-off skips a parked worker that stopped beating."""
    return _in_model("beats", model)


def running(model: str) -> str:
    """Sorted set of the model's running request ids, scored by lease expiry (ms)."""
    return _in_model("running", model)


def parked(model: str) -> str:
    """Sorted set of the model's parked workers (a free slot, nothing queued for them),
    scored by when they parked: the longest-waiting is handed the next request."""
    return _in_model("parked", model)


def parked_terms(model: str) -> str:
    """Hash of parked worker id -> "free|budget|idle|lease ms|in-progress ms"."""
    return _in_model("parked-terms", model)


def routes(model: str) -> str:
    """Hash of queued request id -> its route hint (:class:`llmq.protocol.codec.RouteHint`:
    arrival, priority, session, leading block names), for cache-aware routing; written
    with the queue entry, gone when the request leaves the queue."""
    return _in_model("routes", model)


def overtaken(model: str) -> str:
    """Hash of queued request id -> how many later requests a routed claim took before
    it (the overtaking guard of :mod:`llmq.protocol.routing`)."""
    return _in_model("overtaken", model)


def held(model: str) -> str:
    """Hash of queued request id -> when (ms) a routed claim or hand-off first left it
    for the worker holding its prefix: the wait guard counts from there."""
    return _in_model("held", model)


def loads(model: str) -> str:
    """Hash of worker id -> "running|capacity" (:func:`llmq.protocol.codec.load`), set at
    each routed claim and routing beat: the load guard of :mod:`llmq.protocol.routing`."""
    return _in_model("loads", model)


def cache_prefix(model: str) -> str:
    return _in_model("cache", model) + ":"


def cache(worker_id: str, model: str) -> str:
    """Set of the KV block names (:func:`llmq.model.blocks.block_hashes`) that a worker's
    cache holds for ``model``, with the TTL of its registry entry, renewed at each beat."""
    return f"{cache_prefix(model)}{worker_id}"


def session_prefix(model: str) -> str:
    return _in_model("session", model) + ":"


def session(session_id: str, model: str) -> str:
    """The worker that last took a request of the session (a hashed ``user`` or
    ``X-Session-Id``), with a TTL: session affinity."""
    return f"{session_prefix(model)}{session_id}"


def fair(model: str) -> str:
    """Hash of request id -> "tenant|weight|priority" (:func:`llmq.protocol.codec.fair_entry`)
    of the model's queued and running requests, under ``LLMQ_FAIRNESS=vtc``."""
    return _in_model("fair", model)


def vtc(model: str) -> str:
    """Hash of the tenants' virtual counters (``t:<tenant>``), ``_floor``, and their
    recent service (``r:<tenant>``: "period|tokens|tokens before"), kept by
    ``llmq/protocol/lua/fair.lua``."""
    return _in_model("vtc", model)


def fair_tenants(model: str) -> str:
    """Set of the tenants with requests in the model's queue."""
    return _in_model("fair-tenants", model)


def fairq_prefix(model: str) -> str:
    """Prefix of each tenant's sorted set of its queued request ids (scored as queued)."""
    return _in_model("fairq", model) + ":"


def served(model: str, period: int) -> str:
    """How many of the model's requests finished in ``period`` (unix seconds divided
    by :data:`SERVED_PERIOD_SECONDS`), with a short TTL: the pool's measured service
    rate, which shedding by expected wait divides the queue by."""
    return f"{_in_model('served', model)}:{period}"


#: The length of one period of :func:`served`.
SERVED_PERIOD_SECONDS = 5


def routing_stats(model: str) -> str:
    """Hash of counters of routed claims and hand-offs: how often affinity chose and
    how often each guard fired (:data:`llmq.protocol.codec.ROUTING_COUNTERS`)."""
    return _in_model("routing", model)


def policy_version(model: str) -> str:
    """The version of the pool policy a model's claims run under at least: a claim
    made under an older one is refused (``lua/claim.lua``). Raised after each change
    of :data:`POLICY` (``lua/policy_publish.lua``)."""
    return _in_model("policy-version", model)


def batch_yield(request_id: str, model: str) -> str:
    """A full worker's claim to hand back a batch line for the live request
    ``request_id`` (PX TTL), so that one live request frees one slot, not one per worker."""
    return f"{_in_model('batch-yield', model)}:{request_id}"


def fair_yield_prefix(model: str) -> str:
    """Prefix of a full worker's claim to give a slot to the waiting request whose id
    follows (PX TTL), so that one waiting request frees one slot, not one per worker."""
    return _in_model("fair-yield", model) + ":"


def cancel_flag_prefix(model: str) -> str:
    return _in_model("cancelled", model) + ":"


def cancel_flag(request_id: str, model: str) -> str:
    """Set (with a TTL) when a request that was not queued any more is cancelled; in
    the model slot, since the claim and the lease renewal check it."""
    return f"{cancel_flag_prefix(model)}{request_id}"


def wake(model: str) -> str:
    """Pub/sub channel that tells idle workers of the model that work arrived."""
    return _in_model("wake", model)


def cancel_channel(model: str) -> str:
    """Pub/sub channel that tells the model's workers to stop a request."""
    return _in_model("cancel", model)


def handoff_prefix(model: str) -> str:
    return _in_model("handoff", model) + ":"


def handoff(worker_id: str, model: str) -> str:
    """Pub/sub channel on which one worker of ``model`` is handed requests claimed for it."""
    return f"{handoff_prefix(model)}{worker_id}"


def job_prefix(model: str) -> str:
    return f"{JOB_PREFIX}{model_tag(model)}:"


def in_progress_prefix(model: str) -> str:
    return f"{IN_PROGRESS_PREFIX}{model_tag(model)}:"


def retry_prefix(model: str) -> str:
    return f"{RETRY_PREFIX}{model_tag(model)}:"


def job(request_id: str, model: str) -> str:
    """The job record (the serialized :class:`~llmq.schema.JobPayload`), under arq's
    prefix but in the model slot: arq's worker never names it (see
    :class:`worker.queue_worker.ClaimingRedis`), so it need not be arq's own
    ``arq:job:<id>``."""
    return f"{job_prefix(model)}{request_id}"


def in_progress(request_id: str, model: str) -> str:
    return f"{in_progress_prefix(model)}{request_id}"


def retry(request_id: str, model: str) -> str:
    """The request's try counter: its attempt, the fencing token of a run."""
    return f"{retry_prefix(model)}{request_id}"


# --- the request slot -------------------------------------------------------------


def _in_request(name: str, request_id: str, tag: str | None = None) -> str:
    return f"{PREFIX}:{name}:{tag or request_tag(request_id)}:{request_id}"


def fence(request_id: str) -> str:
    """Hash guarding the request's writes (``llmq/protocol/lua/publish.lua``): ``attempt``, the
    lowest attempt allowed to write; ``next``, the stream's next token index;
    ``ended``, '1' once a terminal event is written."""
    return _in_request("fence", request_id)


def request(request_id: str) -> str:
    """Hash holding the request's status and timings (:class:`~llmq.schema.RequestRecord`)."""
    return _in_request("req", request_id)


def stream(request_id: str) -> str:
    """The request's token stream (events of :mod:`llmq.schema`)."""
    return _in_request("stream", request_id)


def stored_response(request_id: str) -> str:
    """A Responses API response and its conversation (``GET /v1/responses/{id}``,
    ``previous_response_id``), JSON with the request's TTL; in the request's slot."""
    return _in_request("response", request_id)


#: Matches every request record's key (a SCAN or KEYS pattern).
REQUESTS_GLOB = f"{PREFIX}:req:*"


@lru_cache(maxsize=4096)
def run_keys(request_id: str) -> tuple[str, str, str, str]:
    """What a run writes, in ``publish.lua``'s order: the request's stream, record and
    fence, and its group's lifecycle stream. A worker's publisher names them on every
    flush of every running request: they are built once (a few thousand requests'
    worth are kept, more than a worker runs at once)."""
    group = request_group(request_id)
    tag = group_tag(group)
    return (
        _in_request("stream", request_id, tag),
        _in_request("req", request_id, tag),
        _in_request("fence", request_id, tag),
        lifecycle_group(group),
    )


def lifecycle_group(group: int) -> str:
    return f"{PREFIX}:lifecycle:{group_tag(group)}"


def lifecycle(request_id: str) -> str:
    """The lifecycle stream of the request's group: one entry per state change of the
    group's requests (see :class:`llmq.schema.Lifecycle`)."""
    return lifecycle_group(request_group(request_id))


#: Every lifecycle stream, one per request group: a reader of the lifecycle reads all.
LIFECYCLES: tuple[str, ...] = tuple(lifecycle_group(g) for g in range(REQUEST_GROUPS))


# --- the global slot --------------------------------------------------------------


def attached(process_id: str) -> str:
    """Set of ``<id>:<model>`` of OpenAI requests whose client is connected to this API
    process: nobody can resume them, so they are cancelled if the process dies."""
    return f"{ATTACHED_PREFIX}{process_id}"


def attached_member(request_id: str, model: str) -> str:
    return codec.attached_member(request_id, model)


def worker(worker_id: str) -> str:
    """A worker's registry entry (:class:`~llmq.schema.WorkerInfo` JSON, short TTL)."""
    return f"{PREFIX}:{GLOBAL}:worker:{worker_id}"


def drain(worker_id: str) -> str:
    """Set (with a TTL) when an operator drains the worker: it claims nothing more
    (:func:`llmq.registry.drain`)."""
    return f"{PREFIX}:{GLOBAL}:drain:{worker_id}"


# --- single keys, in no script: any slot ------------------------------------------


def control(process_id: str, group: int | None = None) -> str:
    """A tiny stream that wakes one API process's relay when it gains a subscriber;
    on a Redis Cluster one per request group, in the group's slot
    (:mod:`api.streams.grouped_relay`)."""
    if group is None:
        return f"{PREFIX}:ctl:{process_id}"
    return f"{PREFIX}:ctl:{{r:{group}}}:{process_id}"


def group_of(key: str) -> int:
    """The request group of a key in a request slot (its ``{r:<k>}`` tag)."""
    start = key.index("{r:") + 3
    return int(key[start : key.index("}", start)])


#: The metrics slot's tag: every metric key shares it, so that a flush is one atomic
#: script call on a Redis Cluster as on a single Redis (``lua/metrics_flush.lua``).
METRICS = "{metrics}"


def metric(family: str) -> str:
    """Hash of a metric family's cluster-wide totals (see :mod:`llmq.metrics`)."""
    return f"{PREFIX}:{METRICS}:totals:{family}"


def metrics_second(unix_second: int) -> str:
    """Hash of counter totals flushed during one second (short TTL): recent rates."""
    return f"{PREFIX}:{METRICS}:second:{unix_second}"


def metrics_minute(unix_minute: int) -> str:
    """Hash of the per-tenant counters flushed during one minute (an hour's TTL): a
    tenant's usage over the last hour."""
    return f"{PREFIX}:{METRICS}:minute:{unix_minute}"


def metrics_flush(tally: str, seq: int) -> str:
    """Marker written with one flush of a process's metrics (short TTL): whether a
    flush whose reply was lost was applied."""
    return f"{PREFIX}:{METRICS}:flush:{tally}:{seq}"


#: The audit trail: one entry per action of the admin API (:mod:`llmq.admin`), capped.
AUDIT = f"{PREFIX}:audit"

#: The autoscaler's leader lease: the id of the one controller that may act (PX TTL).
AUTOSCALER_LEADER = f"{PREFIX}:autoscaler:leader"

#: Hash of model -> the autoscaler's published state (:class:`~llmq.schema.ScaleState`
#: JSON), renewed every control period and expiring with the controller: while a
#: model's entry is fresh, the API accepts its requests with no live worker.
AUTOSCALER_STATE = f"{PREFIX}:autoscaler:state"


# --- files and batches (the Batch API: api/batch/files.py, api/batches.py) ----------------
# A file is one key (its own slot); a batch's keys share the batch's tag ``{b:<id>}``,
# so that recording a line's result (``llmq/protocol/lua/batch_result.lua``) is one
# script. Ids are made by the API (``file-<hex>``, ``batch_<hex>``), never braced.


def file(file_id: str) -> str:
    """Hash of an uploaded or output file: ``meta`` (:class:`api.batch.files.FileObject`
    JSON) and ``content`` (its text); expires with ``LLMQ_BATCH_TTL_SECONDS``."""
    return f"{PREFIX}:file:{file_id}"


def files_of(owner: str) -> str:
    """Sorted set of an owner's file ids by creation time (``-``: auth off)."""
    return f"{PREFIX}:files:{owner}"


def batches_of(owner: str) -> str:
    """Sorted set of an owner's batch ids by creation time (``-``: auth off)."""
    return f"{PREFIX}:batches:{owner}"


#: Sorted set of the batches that are not ended yet, by creation time: what the
#: feeder (``api/batch/batch_feeder.py``) feeds, collects and finalizes.
BATCHES_ACTIVE = f"{PREFIX}:batches-active"

#: The batch feeder's lease: the id of the one API process that feeds (PX TTL).
BATCH_FEEDER = f"{PREFIX}:batch-feeder"


def _in_batch(name: str, batch_id: str) -> str:
    return f"{PREFIX}:{name}:{{b:{batch_id}}}"


def batch(batch_id: str) -> str:
    """Hash of a batch: ``meta`` (:class:`api.batch.batch_store.BatchObject` JSON), ``status``,
    ``next`` (the next line to feed), ``completed``, ``failed``."""
    return _in_batch("batch", batch_id)


def batch_lines(batch_id: str) -> str:
    """List of the batch's input lines (JSON), copied from its file when it was created."""
    return _in_batch("batch-lines", batch_id)


def batch_running(batch_id: str) -> str:
    """Hash of custom_id -> the fed line's requests (JSON), until its result is recorded."""
    return _in_batch("batch-running", batch_id)


def batch_output(batch_id: str) -> str:
    """Hash of custom_id -> output line (JSON) of each line that succeeded."""
    return _in_batch("batch-output", batch_id)


def batch_errors(batch_id: str) -> str:
    """Hash of custom_id -> error line (JSON) of each line that failed or did not run."""
    return _in_batch("batch-errors", batch_id)
