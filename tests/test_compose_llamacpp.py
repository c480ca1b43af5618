"""``deploy/compose/llamacpp.yml`` run for real: two (worker, ``llama-server``) pairs
behind one API, as a user runs the example, on the tiny model of :mod:`rigs.llama`
instead of a downloaded GGUF (``LLMQ_MODELS`` points the servers at it).

The servers run the image the example names, ``ghcr.io/ggml-org/llama.cpp:server``;
where no registry is reachable ``scripts/standin-images.sh`` builds a stand-in of it
around the ``llama-server`` that the upstream tests run. Like the main stack's test
(tests/test_compose_stack.py) it needs a Docker engine and fails, never skips,
without one.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from rigs.llama import write_tiny_gguf
from tests.support.compose import (
    ROOT,
    Compose,
    docker,
    inspect,
    live_workers,
    project_up,
    sdk,
)
from tests.support.processes import wait_for

# The first test builds the images (the stand-ins and llmq's), minutes on two cores.
pytestmark = [pytest.mark.timeout(900), pytest.mark.docker, pytest.mark.engine]

COMPOSE_FILE = ROOT / "deploy" / "compose" / "llamacpp.yml"
#: The example's model name, and its servers' slots (its llama command's --parallel).
MODEL, SLOTS = "local", 4
PROMPT = "the queue in front of the engine"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("models")
    write_tiny_gguf(directory / "model.gguf")
    return directory


@pytest.fixture(scope="module")
def pairs(models: Path) -> Iterator[Compose]:
    with project_up(
        COMPOSE_FILE,
        lambda compose: len(live_workers(compose.url)) == 2,
        "two workers registered",
        suffix="-llamacpp",
        env={"LLMQ_MODELS": str(models)},
        seconds=180,
    ) as compose:
        yield compose


def completion(client: openai.OpenAI, max_tokens: int) -> str:
    answer = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=max_tokens, temperature=0
    )
    return answer.choices[0].text


def test_each_worker_drives_its_own_server_and_serves_its_tokens(pairs: Compose) -> None:
    """Each worker learned its server's slots as its cap; the text through llmq is the
    text a server of the pair gives directly (asked from inside its container: the
    example publishes no server port)."""
    workers = live_workers(pairs.url)
    assert [w["concurrency"] for w in workers] == [SLOTS, SLOTS], workers
    through = completion(sdk(pairs), 48)
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 48, "temperature": 0}
    [server] = pairs.ids("llama-1")
    asked = docker(
        "exec", server, "curl", "-fsS", "http://127.0.0.1:8080/v1/completions",
        "-H", "content-type: application/json", "-d", json.dumps(body),
    )  # fmt: skip
    assert through == json.loads(asked)["choices"][0]["text"]


def server_pids(compose: Compose) -> dict[str, int]:
    """Each live worker's id and the host pid of its pair's server (worker-N drives
    llama-N), looked up before a stream starts."""
    by_host = {}
    for n in (1, 2):
        [worker] = compose.ids(f"worker-{n}")
        [server] = compose.ids(f"llama-{n}")
        by_host[inspect(worker)["Config"]["Hostname"]] = inspect(server)["State"]["Pid"]
    return {w["id"]: by_host[w["host"]] for w in live_workers(compose.url)}


def test_a_killed_server_hands_its_request_to_the_other_pair(pairs: Compose) -> None:
    """SIGKILL of a server mid-stream (a crash): the request re-runs on the other
    pair's server and ends at its length, its stream whole to a reader; the server
    comes back with its container, and its worker with it.

    The tiny model writes thousands of tokens a second, faster than a loaded machine
    relays them, so the kill is not timed by what a reader has read alone: both
    servers are paused (SIGSTOP) before the request is sent, the one whose worker
    runs it resumes, and it is killed once its first tokens reach the reader."""
    tokens = 4000  # within a slot's context (16384 / 4) with the prompt
    pids = server_pids(pairs)
    for pid in pids.values():
        os.kill(pid, signal.SIGSTOP)
    try:
        with httpx.Client(base_url=pairs.url, timeout=30) as client:
            body = {"model": MODEL, "prompt": PROMPT, "max_tokens": tokens, "temperature": 0}
            answer = client.post("/v1/requests", json=body)
            assert answer.status_code == 202, answer.text
            rid = answer.json()["id"]
            seen: dict[str, Any] = {}

            def started() -> bool:
                seen.update(client.get(f"/v1/requests/{rid}").json())
                return bool(seen["status"] != "queued")

            wait_for(started, 60, "the request to start")
            assert seen["status"] == "running", seen
            victim = pids[seen["worker"]]
            os.kill(victim, signal.SIGCONT)
            text: dict[int, str] = {}
            ended: dict[str, Any] = {}
            with client.stream("GET", f"/v1/requests/{rid}/events", timeout=120) as events:
                for line in events.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    event = json.loads(line[len("data: ") :])
                    if event["type"] == "tokens":
                        if not text:  # mid-stream: the server has thousands to go
                            os.kill(victim, signal.SIGKILL)
                            for pid in set(pids.values()) - {victim}:
                                os.kill(pid, signal.SIGCONT)
                        for i, token in enumerate(event["tokens"], event["index"]):
                            text.setdefault(i, token)
                    elif event["type"] in ("done", "error"):
                        ended = event
            final = client.get(f"/v1/requests/{rid}").json()
    finally:
        for pid in pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    if ended.get("type") != "done":  # what each attempt met, from the workers' own logs
        workers = pairs("logs", "--tail", "30", "worker-1", "worker-2", check=False)
        raise AssertionError(f"{ended}\n{final}\n{workers}")
    assert ended["finish_reason"] == "length", ended
    assert sorted(text) == list(range(tokens)), "every token, once, in order"
    assert final["attempts"] == 2 and final["worker"] != seen["worker"], final
    assert final["completion_tokens"] == tokens, final
    wait_for(lambda: len(live_workers(pairs.url)) == 2, 120, "the pair back, both workers live")
