"""One request's admission as one object, from auth to enqueue.

The auth dependency (:func:`api.admission.auth.admitted`) makes it with the request's owner
and tenant; the route passes it to :mod:`api.admission.submit`, which reads the pool policy
through it (one snapshot per model for the whole admission, so that every check of
a request reads the same version) and records there what each step decided: the
quota's verdict (its ``x-ratelimit-*`` headers, which
:class:`api.admission.flow.RateLimitHeaders` adds to the response), the expected wait that
shedding measured, and whether the queue took it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from starlette.requests import Request
from starlette.types import Scope

from api.state import AppState
from llmq.policy.model import Policy
from llmq.protocol.quota import Verdict
from llmq.tenants import Tenant

#: The key of the admission in a request's state (``scope["state"]``).
_KEY = "llmq_admission"


@dataclass(frozen=True)
class BatchBand:
    """A batch line's place in the queue: the batch band (:func:`batch_score`), not
    its body's priority, and a queue deadline at the batch's completion window."""

    batch_id: str
    deadline: float


@dataclass
class Admission:
    """A request on its way to the queue: who asks, under which policy, and what was
    decided about it so far."""

    state: AppState
    #: The digest of the request's key (None: auth is off).
    owner: str | None
    tenant: Tenant | None
    #: The digest of a key that can be revoked (one made with ``llmq key create``).
    revocable: str | None = None
    #: Lives only as long as this API process (its client cannot reconnect elsewhere).
    attach: bool = False
    #: The routing session (``X-Session-Id``), else the body's ``user``.
    session: str | None = None
    #: A batch line's band; None for a live request.
    band: BatchBand | None = None
    #: The quota take's verdict, once the queue answered.
    quota: Verdict | None = None
    #: The ``x-ratelimit-*`` headers of a quota that was taken.
    rate_headers: dict[str, str] = field(default_factory=dict)
    #: The expected wait in the queue that shedding measured (ms).
    expected_wait_ms: float | None = None
    #: Whether the queue took the request.
    queued: bool = False
    _policies: dict[str, Policy] = field(default_factory=dict)

    def policy(self, model: str) -> Policy:
        """The policy of ``model``, read once: the same version for every check."""
        found = self._policies.get(model)
        if found is None:
            found = self._policies[model] = self.state.policy.of(model)
        return found

    def live(self, *, attach: bool, session: str | None = None) -> Admission:
        """This admission for a live request (``attach``: see :attr:`attach`)."""
        self.attach, self.session = attach, session
        return self


def keep(request: Request, admission: Admission) -> None:
    """Keep the request's admission in its state, where :func:`kept` finds it."""
    request.scope.setdefault("state", {})[_KEY] = admission


def kept(scope: Scope) -> Admission | None:
    """The admission a request kept (None: it made none, e.g. a health probe)."""
    found = scope.get("state", {}).get(_KEY)
    return found if isinstance(found, Admission) else None
