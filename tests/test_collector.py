"""A worker process tunes its garbage collector before it serves, as the API does
(``tests/test_api_processes.py``): a full collection would stall every stream it runs."""

from __future__ import annotations

import re

import pytest

from tests.support.servers import SpawnWorkers

pytestmark = pytest.mark.timeout(30)


async def test_a_worker_freezes_what_it_started_with_before_serving(
    spawn_workers: SpawnWorkers,
) -> None:
    [proc] = await spawn_workers(1)
    found = re.search(r"garbage collector: (\d+) objects frozen", proc.output())
    assert found is not None, proc.tail()
    assert int(found.group(1)) > 10_000
