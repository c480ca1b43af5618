"""arq's job record, which llmq writes itself: its function, fields and serializer.

A worker runs each request as an arq job, so a request's job record is one that
arq's worker reads: arq's field names (``f`` the function, ``a``/``k`` its
arguments, ``t`` the try, ``et`` the enqueue time), and JSON through the worker's
serializer hooks (:func:`serialize`, :func:`deserialize`) rather than arq's
default pickle, so that any Redis consumer can read it and loading it runs no code.

llmq does not enqueue through arq. Its enqueue script (``enqueue.lua``, called by
:meth:`llmq.protocol.queue.Queue.admit`) writes the job record in the model's slot
in one atomic step with the queue entry, the cost and deadline that admission
keeps, and, when a worker is parked, the claim and its hand-off. arq's own
``ArqRedis.enqueue_job`` cannot: it WATCHes ``arq:job:<id>``, checks
``arq:result:<id>`` and then writes the job key and the queue in one MULTI, and
those keys, under arq's fixed prefixes with no hash tag, hash to slots of their
own per request, which a Redis Cluster refuses in one transaction (CROSSSLOT).
"""

from __future__ import annotations

import json
from typing import Any

from llmq.schema import JobPayload

#: The arq function name of every llmq job.
JOB_FUNCTION = "generate"

#: Lifetime of a job's try counter, as arq sets it.
RETRY_TTL_SECONDS = 88400


def serialize_job(payload: dict[str, Any], enqueue_ms: int) -> bytes:
    """An arq job record (arq's own field names), as JSON rather than arq's pickle."""
    data: dict[str, Any] = {
        "t": None,
        "f": JOB_FUNCTION,
        "a": [],
        "k": {"payload": payload},
        "et": enqueue_ms,
    }
    return serialize(data)


def serialize(data: dict[str, Any]) -> bytes:
    """arq's serializer hook: JSON, readable by any Redis consumer and safe to load."""
    return json.dumps(data, separators=(",", ":")).encode()


def deserialize(raw: bytes) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(raw)
    return data


def job_fields(payload: JobPayload) -> dict[str, Any]:
    """The payload as JSON, sampling parameters left at their defaults omitted: a
    plain request stays readable by workers that predate the newer parameters."""
    job = payload.model_dump(mode="json")
    job["params"] = payload.params.model_dump(mode="json", exclude_defaults=True)
    return job
