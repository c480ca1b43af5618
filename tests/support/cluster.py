"""The Redis Cluster fixture: three primaries and a replica of each, real processes.

Started once per test session (about two seconds, :mod:`llmq.embedded_cluster`)
and flushed by the tests that use it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from llmq.embedded_cluster import EmbeddedCluster


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(primaries=3, replicas=1) as cluster:
        yield cluster
