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

import json
import os
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import Future
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
pytestmark = pytest.mark.timeout(900)

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
    pair's server and the client's stream goes on to its length; the server comes
    back with its container, and its worker with it."""
    tokens = 3000
    client = sdk(pairs)
    whole = completion(client, tokens)
    pids = server_pids(pairs)
    text = ""
    killed: dict[str, Any] = {}
    over: Future[None] = Future()

    def read() -> None:
        nonlocal text
        try:
            stream = client.completions.create(
                model=MODEL, prompt=PROMPT, max_tokens=tokens, temperature=0, stream=True
            )
            for chunk in stream:
                text += chunk.choices[0].text if chunk.choices else ""
                if not killed and len(text) >= 64:
                    rid = chunk.id.split("-", 1)[1]
                    killed.update(native_record(pairs, rid), rid=rid, text=text)
                    os.kill(pids[killed["worker"]], signal.SIGKILL)
                if chunk.choices and chunk.choices[0].finish_reason:
                    killed["finish"] = chunk.choices[0].finish_reason
            over.set_result(None)
        except BaseException as exc:
            over.set_exception(exc)

    threading.Thread(target=read, name="stream", daemon=True).start()
    over.result(timeout=120)
    assert killed["status"] == "running", "the run ended before its server was killed"
    assert whole.startswith(killed["text"]), "the text before the crash is the server's"
    assert killed["finish"] == "length"
    final = native_record(pairs, killed["rid"])
    assert final["status"] == "done" and final["attempts"] == 2, final
    assert final["worker"] != killed["worker"], "re-run on the other pair"
    assert final["completion_tokens"] == tokens, final
    wait_for(lambda: len(live_workers(pairs.url)) == 2, 120, "the pair back, both workers live")


def native_record(compose: Compose, rid: str) -> dict[str, Any]:
    """The native API's record of a request (the OpenAI one says nothing of workers)."""
    answer: dict[str, Any] = httpx.get(f"{compose.url}/v1/requests/{rid}", timeout=10).json()
    return answer
