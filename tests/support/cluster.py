"""The Redis Cluster fixture: three primaries and a replica of each, real processes.

Started once per test session (about two seconds, :mod:`rigs.embedded_cluster`)
and flushed by the tests that use it (:data:`BOTH_BACKENDS`).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rigs.embedded_cluster import EmbeddedCluster

#: Runs a test once on a single Redis and once on the session's Redis Cluster: the
#: ``backend`` fixture (``tests/conftest.py``) then points ``redis`` and ``redis_url``
#: (and so every llmq part the test starts) at each in turn.
BOTH_BACKENDS = pytest.mark.parametrize("backend", ["single", "cluster"], indirect=True)


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(primaries=3, replicas=1) as cluster:
        yield cluster
