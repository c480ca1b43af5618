"""``docker compose up`` for real: the stack that docker-compose.yml builds and runs.

The module brings one compose project up with ``up -d --build`` (its own project
name, published port and volume), drives it through the published port as a user
would, and takes it down with ``down -v``. It needs a Docker engine: ``make test``
and ``.ci/run`` start one (``scripts/dockerd.sh``), and base images, pulled or
built as stand-ins (``scripts/standin-images.sh``, run here first). With no engine
it fails, never skips, so that CI cannot pass without running it. Tests run in
file order against the one project; each brings the workers to the state it needs.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types import Completion

from tests.support.compose import (
    Compose,
    docker,
    inspect,
    live_workers,
    project_up,
    sdk,
)
from tests.support.processes import http_status, wait_for

# The first test builds the images, from nothing on a new machine (minutes on two
# busy cores); each step below has its own shorter deadline.
pytestmark = [pytest.mark.timeout(900), pytest.mark.docker]

ROOT = Path(__file__).resolve().parent.parent
#: Where containers may have addresses: the benchmarking range (scripts/dockerd.sh).
BENCHMARKING = ipaddress.ip_network("198.18.0.0/15")
#: The compose file's worker concurrency (LLMQ_CONCURRENCY).
WORKER_SLOTS = 8
#: A seeded prompt: the mock writes the same text for it on every run.
PROMPT, SEED = "survive this", 11
#: The mock's answers stop by themselves (LLMQ_MODEL_MEAN_TOKENS); these run to max_tokens.
UNTIL_LIMIT = {"ignore_eos": True}


def submit(client: httpx.Client, body: dict[str, Any]) -> str:
    """A native request's id, once the API has queued it."""
    response = client.post("/v1/requests", json=body)
    assert response.status_code == 202, response.text
    rid: str = response.json()["id"]
    return rid


def record(url: str, rid: str) -> dict[str, Any]:
    """The native API's record of a request; {} while the API cannot answer."""
    try:
        response = httpx.get(f"{url}/v1/requests/{rid}", timeout=2)
    except httpx.HTTPError:
        return {}
    found: dict[str, Any] = response.json() if response.is_success else {}
    return found


def worker_containers(compose: Compose) -> dict[str, dict[str, Any]]:
    """Each live worker's id and its container's ``docker inspect``, looked up before
    a stream starts: mid-stream there is time for one HTTP call, not for compose."""
    by_host = {}
    for container in compose.ids("worker"):
        details = inspect(container)
        by_host[details["Config"]["Hostname"]] = details
    return {w["id"]: by_host[w["host"]] for w in live_workers(compose.url)}


def assert_benchmarking_addresses(compose: Compose) -> None:
    """Every container's address, and its network's subnet, in 198.18.0.0/15."""
    for container in compose.ids():
        details = inspect(container)
        for name, net in details["NetworkSettings"]["Networks"].items():
            address = ipaddress.ip_address(net["IPAddress"])
            assert address in BENCHMARKING, (details["Name"], name, str(address))
            for config in json.loads(docker("network", "inspect", name))[0]["IPAM"]["Config"]:
                subnet = ipaddress.ip_network(config["Subnet"])
                assert subnet.subnet_of(BENCHMARKING), (name, str(subnet))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def stack() -> Iterator[Compose]:
    with project_up(
        ROOT / "docker-compose.yml",
        lambda compose: http_status(compose.url + "/readyz") == 200,
        "/readyz",
    ) as compose:
        yield compose


def seeded(client: openai.OpenAI, max_tokens: int) -> openai.Stream[Completion]:
    """A streaming completion of the seeded prompt."""
    return client.completions.create(
        model="mock",
        prompt=PROMPT,
        seed=SEED,
        max_tokens=max_tokens,
        stream=True,
        extra_body=UNTIL_LIMIT,
    )


def test_up_streams_through_the_published_port(stack: Compose) -> None:
    assert_benchmarking_addresses(stack)
    client = sdk(stack)
    chat = client.chat.completions.create(
        model="mock",
        messages=[{"role": "user", "content": "Tell me a story"}],
        max_tokens=10,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=UNTIL_LIMIT,
    )
    chunks = list(chat)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(content.split()) == 10
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 10
    stream = client.completions.create(
        model="mock", prompt="Once upon", max_tokens=7, stream=True, extra_body=UNTIL_LIMIT
    )
    texts = [c.choices[0].text for c in stream if c.choices]
    assert len("".join(texts).split()) == 7
    assert [m.id for m in client.models.list()] == ["mock"]


def test_scaled_to_three_workers_all_serve(stack: Compose) -> None:
    """Three workers' slots in all: only with every worker running can all be busy."""
    stack.workers(3)
    assert_benchmarking_addresses(stack)
    body = {"model": "mock", "prompt": "long", "max_tokens": 4000, **UNTIL_LIMIT}
    with httpx.Client(base_url=stack.url, timeout=10) as c:
        ids = [submit(c, body) for _ in range(3 * WORKER_SLOTS)]
        try:
            wait_for(
                lambda: all(record(stack.url, r).get("status") == "running" for r in ids),
                60,
                f"{len(ids)} requests running at once",
            )
            workers = {record(stack.url, r)["worker"] for r in ids}
        finally:
            for rid in ids:
                c.delete(f"/v1/requests/{rid}")
        wait_for(
            lambda: all(record(stack.url, r).get("status") == "cancelled" for r in ids),
            30,
            "the requests to be cancelled",
        )
    hosts = {w["id"]: w["host"] for w in live_workers(stack.url)}
    assert len({hosts[w] for w in workers}) == 3, workers


@dataclass
class Streamed:
    """What a streaming completion delivered: its request id, text and finish reason."""

    rid: str = ""
    text: str = ""
    finish: str | None = None
    acted: bool = False


def stream_seeded(
    compose: Compose, max_tokens: int, act: Callable[[str], None], seconds: float = 60
) -> Streamed:
    """Streams the seeded prompt with the SDK and calls ``act(request id)`` once ten
    words have arrived. A stalled stream still gets keep-alives, so no read timeout
    would end it: the stream is read in a daemon thread, and a stream not over
    within ``seconds`` fails the test (the module's ``down`` ends the thread)."""
    got = Streamed()
    over: Future[None] = Future()

    def read() -> None:
        try:
            for chunk in seeded(sdk(compose), max_tokens):
                got.rid = chunk.id.split("-", 1)[1]
                if chunk.choices:
                    got.text += chunk.choices[0].text
                    got.finish = chunk.choices[0].finish_reason or got.finish
                if not got.acted and len(got.text.split()) >= 10:
                    got.acted = True
                    act(got.rid)
            over.set_result(None)
        except BaseException as exc:  # handed to the test's thread
            over.set_exception(exc)

    threading.Thread(target=read, name="stream", daemon=True).start()
    try:
        over.result(timeout=seconds)
    except TimeoutError:
        raise AssertionError(
            f"the stream had not ended after {seconds:g}s ({len(got.text.split())} words)"
        ) from None
    assert got.acted, "the stream ended before ten words"
    return got


def test_worker_killed_from_the_host_mid_stream_loses_nothing(stack: Compose) -> None:
    """SIGKILL of the worker's process (a crash, not ``docker kill``, which counts as
    a manual stop): the stream goes on with the same text, the container comes back."""
    stack.workers(3)
    whole = sdk(stack).completions.create(
        model="mock", prompt=PROMPT, seed=SEED, max_tokens=200, extra_body=UNTIL_LIMIT
    )
    containers = worker_containers(stack)
    killed: dict[str, Any] = {}

    def kill(rid: str) -> None:
        killed.update(record(stack.url, rid))
        os.kill(containers[killed["worker"]]["State"]["Pid"], signal.SIGKILL)

    got = stream_seeded(stack, 200, kill)  # ~4 s at the mock's 50 tokens/s
    assert killed["status"] == "running", "the run ended before its worker was killed"
    assert got.text == whole.choices[0].text, "tokens lost or repeated"
    final = record(stack.url, got.rid)
    assert final["status"] == "done" and final["attempts"] == 2, final
    assert final["worker"] != killed["worker"]
    victim = containers[killed["worker"]]

    def back() -> bool:
        state = inspect(victim["Id"])
        return bool(state["State"]["Running"] and state["RestartCount"] > victim["RestartCount"])

    wait_for(back, 60, "the killed worker's container to be restarted")
    host = victim["Config"]["Hostname"]
    wait_for(
        lambda: any(
            w["host"] == host and w["id"] != killed["worker"] for w in live_workers(stack.url)
        ),
        60,
        "a new worker in the restarted container",
    )


def test_compose_stop_drains_a_running_stream(stack: Compose) -> None:
    """``docker compose stop worker`` mid-stream: the worker finishes the request in
    its drain window (no cut stream, no second run), then exits cleanly."""
    stack.workers(3)
    containers = worker_containers(stack)
    serving: list[str] = []
    with ThreadPoolExecutor(1) as pool:
        stopping: list[Future[str]] = []

        def stop(rid: str) -> None:
            serving.append(containers[record(stack.url, rid)["worker"]]["Id"])
            stopping.append(pool.submit(stack, "stop", "worker"))

        got = stream_seeded(stack, 500, stop)  # 10 s at 50 tokens/s, within the 20 s drain
        stopping[0].result(timeout=150)
    assert got.finish == "length" and len(got.text.split()) == 500, "the stream was cut"
    final = record(stack.url, got.rid)
    assert final["status"] == "done" and final["attempts"] == 1, final
    logs = subprocess.run(
        ["docker", "logs", serving[0]], capture_output=True, text=True, timeout=60
    ).stderr
    assert "stopping: draining 1 running" in logs, "SIGTERM came after the stream had ended"
    for container in stack.ids("worker"):
        state = inspect(container)["State"]
        assert not state["Running"] and state["ExitCode"] == 0, state


def test_queued_requests_survive_redis_being_replaced(stack: Compose) -> None:
    """Requests queued while no worker runs outlive a new Redis container: the AOF on
    the named volume is all that carries them (the compose file turns RDB off)."""
    stack("stop", "worker")
    body = {"model": "mock", "prompt": PROMPT, "max_tokens": 5, **UNTIL_LIMIT}
    with httpx.Client(base_url=stack.url, timeout=10) as c:
        ids = [submit(c, body) for _ in range(3)]
    assert all(record(stack.url, r)["status"] == "queued" for r in ids)
    old = stack.ids("redis")
    stack("up", "-d", "--no-build", "--no-deps", "--force-recreate", "redis")
    assert stack.ids("redis") != old, "Redis's container was not replaced"
    wait_for(
        lambda: http_status(f"{stack.url}/v1/requests/{ids[0]}") in (200, 404),
        60,
        "the API to answer from the new Redis",
    )
    kept = [record(stack.url, r).get("status") for r in ids]
    assert kept == ["queued"] * 3, f"queued requests lost with Redis's container: {kept}"
    stack("start", "worker")
    wait_for(
        lambda: all(record(stack.url, r).get("status") == "done" for r in ids),
        90,
        "the queued requests to run after Redis came back",
    )
    assert all(record(stack.url, r)["completion_tokens"] == 5 for r in ids)


def test_down_leaves_nothing(stack: Compose) -> None:
    mounted = {
        m["Name"] for c in stack.ids() for m in inspect(c)["Mounts"] if m["Type"] == "volume"
    }
    assert mounted, "no volume to check"
    stack("down", "-v", "--remove-orphans", timeout=180)
    label = f"label=com.docker.compose.project={stack.project}"
    assert docker("ps", "-aq", "--filter", label).split() == []
    assert docker("network", "ls", "-q", "--filter", label).split() == []
    assert docker("volume", "ls", "-q", "--filter", label).split() == []
    assert mounted.isdisjoint(docker("volume", "ls", "-q").split()), "a volume outlived down -v"
    assert http_status(stack.url + "/healthz") == -1, "the published port still answers"
