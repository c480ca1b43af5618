"""Fuzz every endpoint from the OpenAPI schema: no 5xx, one error shape, nothing leaked.

Schemathesis generates requests (valid and not) for each operation; the API and a
worker run as real processes on their own Redis database.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable

from llmq.embedded import EmbeddedRedis, free_port
from llmq.protocol import keys
from tests.support.processes import Proc, clean_env, live_workers, wait_for

pytestmark = pytest.mark.slow

DB = 7  # a database of its own: other tests flush database 0


@pytest.fixture(scope="module")
def fuzz_target(redis_server: EmbeddedRedis) -> Iterator[str]:
    url = f"redis://127.0.0.1:{redis_server.port}/{DB}"
    redis.Redis.from_url(url).flushdb()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = clean_env(
        LLMQ_REDIS_URL=url,
        LLMQ_PORT=str(port),
        LLMQ_MAX_TOKENS_LIMIT="32",
        LLMQ_MAX_BODY_BYTES="65536",
        LLMQ_MODEL_TOKENS_PER_SECOND="5000",
        LLMQ_HEARTBEAT_SECONDS="0.2",
        LLMQ_GENERATION_TIMEOUT_SECONDS="5",
        LLMQ_QUEUE_TIMEOUT_SECONDS="5",
    )
    procs = [Proc(["api"], env), Proc(["worker"], env)]
    try:
        wait_for(lambda: live_workers(base) == 1, 30, "the fuzz target", procs[0])
        yield base
    finally:
        for p in procs:
            p.stop()


def check(response: Any) -> None:
    assert response.status_code < 500, response.text[:500]
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}


@pytest.mark.timeout(400)
def test_no_server_errors(fuzz_target: str) -> None:
    """Every operation, valid and invalid inputs: never a 5xx, always OpenAI's error shape."""
    api = schemathesis.openapi.from_url(fuzz_target + "/openapi.json")
    operations = [result.ok() for result in api.get_all_operations()]  # type: ignore[union-attr]
    assert len(operations) >= 8
    tried = 0
    modes = (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)
    for operation, mode in itertools.product(operations, modes):

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
        def fuzz(case: Any) -> None:
            check(case.call(base_url=fuzz_target, timeout=15))

        try:
            fuzz()
        except Unsatisfiable:
            # an operation without inputs (GET /healthz) has no invalid variant
            assert mode is schemathesis.GenerationMode.NEGATIVE
            continue
        tried += 1
    assert tried > len(operations)


@pytest.mark.timeout(60)
def test_nothing_left_behind(fuzz_target: str, redis_server: EmbeddedRedis) -> None:
    """Runs after the fuzzing: no queued or running work and no connection pile-up."""
    client = redis.Redis.from_url(f"redis://127.0.0.1:{redis_server.port}/{DB}")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pending = client.zcard(keys.queue("mock")) + client.zcard(keys.running("mock"))  # type: ignore[operator]
        attached = list(client.scan_iter(match=keys.ATTACHED_PREFIX + "*"))
        if pending == 0 and not attached:
            break
        time.sleep(0.1)
    assert client.zcard(keys.queue("mock")) == 0
    assert client.zcard(keys.running("mock")) == 0
    # every OpenAI request was detached from its API process once its client was done
    assert not list(client.scan_iter(match=keys.ATTACHED_PREFIX + "*"))
    # every key that exists will expire (records, streams) or is a fixed llmq key
    for key in client.scan_iter(count=1000):
        ttl = client.ttl(key)
        assert ttl != -1 or not key.startswith(b"llmq:req:"), key
        assert ttl != -1 or not key.startswith(b"llmq:stream:"), key
    assert httpx.get(fuzz_target + "/healthz").status_code == 200
    clients: list[Any] = client.client_list()  # type: ignore[assignment]
    assert len(clients) < 200, len(clients)
