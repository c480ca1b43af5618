"""Node clients, unmodified, against a real stack: the ``openai`` package's
``responses.create`` (plain and streamed) and ``embeddings.create``, and the AI SDK's
default OpenAI provider (``openai(model)`` speaks the Responses API) for
``generateText``, ``streamText`` and a tool call.

The packages are those pinned in ``tests/node/package-lock.json`` (``npm ci`` in
``tests/node``, which CI runs); without node or them, the test skips and says why,
except in CI (``CI`` set), where a missing client is a failure, never a silent skip.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.support.servers import RunningApi
from worker.embedding import embed_text

NODE_DIR = Path(__file__).parent / "node"


def _missing() -> str | None:
    if shutil.which("node") is None:
        return "node is not installed"
    if not (NODE_DIR / "node_modules" / "@ai-sdk" / "openai").is_dir():
        return "the Node clients are not installed (cd tests/node && npm ci)"
    return None


async def run_clients(api: RunningApi) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        "node",
        str(NODE_DIR / "clients.mjs"),
        cwd=NODE_DIR,
        env={"LLMQ_BASE_URL": api.url + "/v1", "PATH": "/usr/bin:/bin:/usr/local/bin"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await proc.communicate()
    assert proc.returncode == 0, stderr.decode()[-4000:]
    result: dict[str, Any] = json.loads(stdout)
    return result


@pytest.mark.timeout(120)
async def test_node_openai_and_ai_sdk(fast: RunningApi) -> None:
    if (why := _missing()) is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the Node clients: {why}")
        pytest.skip(why)
    out = await run_clients(fast)

    create = out["create"]
    assert create["id"].startswith("resp_")
    assert create["status"] == "incomplete"
    assert len(create["text"].split()) == 5 == create["outputTokens"]

    stream = out["stream"]
    assert stream["kinds"][:2] == ["response.created", "response.in_progress"]
    assert stream["kinds"][-1] == "response.incomplete"
    assert len(stream["deltas"].split()) == 4
    assert stream["finalText"] in (None, stream["deltas"])

    (first, second) = out["embeddings"]
    assert first == pytest.approx(embed_text("one two", 8), abs=1e-6)
    assert second == pytest.approx(embed_text("three", 8), abs=1e-6)

    generated = out["generateText"]
    assert generated["text"] and generated["finishReason"] == "length"
    assert generated["outputTokens"] == len(generated["text"].split())
    assert generated["responseId"].startswith("resp_")

    streamed = out["streamText"]
    assert streamed["text"] and streamed["finishReason"] == "length"

    (call,) = out["toolCall"]["calls"]
    assert call["name"] == "get_weather" and isinstance(call["input"]["city"], str)
    assert out["toolCall"]["results"] == [f"sunny in {call['input']['city']}"]
