"""Drivers turn the controller's target into workers, or only publish it.

- :class:`Driver`: what the controller needs of one. The local driver, which starts
  and stops worker processes, sits above this package with the process supervisor
  (:mod:`cli.local_driver`).
- :class:`PublishDriver` (``llmq autoscale``): acts on nothing; the desired count
  it publishes (``llmq_autoscaler_desired_workers``) is what KEDA scales the
  worker Deployment on (``deploy/k8s/``).
"""

from __future__ import annotations

import logging
from typing import Protocol

from llmq.schema import WorkerInfo

log = logging.getLogger(__name__)


class Driver(Protocol):
    def starting(self, model: str, live: tuple[WorkerInfo, ...]) -> int:
        """Workers ordered but not registered yet (capacity on its way)."""
        ...

    def startup_seconds(self) -> float | None:
        """Measured time from ordering a worker to its registration, if known."""
        ...

    async def scale(self, model: str, target: int, live: tuple[WorkerInfo, ...]) -> None: ...

    async def close(self) -> None: ...


class PublishDriver:
    """For an external actuator (KEDA/HPA, an operator): nothing to start or stop."""

    def starting(self, model: str, live: tuple[WorkerInfo, ...]) -> int:
        return 0

    def startup_seconds(self) -> float | None:
        return None

    async def scale(self, model: str, target: int, live: tuple[WorkerInfo, ...]) -> None:
        return None

    async def close(self) -> None:
        return None
