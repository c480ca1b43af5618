"""A screenshot of one real request's trace in Arize Phoenix's UI, for the docs.

    python -m scripts.trace_screenshot [--out docs/trace.png]

Starts Phoenix (``scripts/phoenix.sh``, the trace backend of the tracing tests) and a
whole local stack (``llmq run``: embedded Redis, an API process, a mock worker) whose
processes send their spans to it by the standard ``OTEL_*`` variables, streams one
chat completion with a client's ``traceparent``, waits until Phoenix holds the
trace's spans, and has headless Chromium (``/usr/bin/chromium``, Debian's package,
which scripts/system-deps.sh installs) draw Phoenix's page of that trace into a PNG.
Everything it started is stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from llmq.embedded import free_port

ROOT = Path(__file__).resolve().parent.parent
#: The spans the picture should hold, from the API's and the worker's processes.
WANTED = {"llmq.request", "llmq.admission", "llmq.queue_wait", "llmq.run", "llmq.relay"}


def _wait(check: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"gave up waiting for {what}")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "LLMQ_"))}
    return {**env, **extra}


def _chat(api: str, traceparent: str) -> None:
    body = {
        "model": "mock",
        "messages": [{"role": "user", "content": "Why was this request slow?"}],
        "max_tokens": 24,
        "stream": True,
    }
    headers = {"traceparent": traceparent}
    with httpx.stream(
        "POST", f"{api}/v1/chat/completions", json=body, headers=headers, timeout=60
    ) as r:
        r.raise_for_status()
        for _ in r.iter_lines():
            pass


def _spans(phoenix: str, trace_id: str) -> set[str]:
    r = httpx.get(f"{phoenix}/v1/projects/default/spans", params={"trace_id": trace_id}, timeout=10)
    return {s["name"] for s in r.json()["data"]} if r.status_code == 200 else set()


def _project_id(phoenix: str) -> str:
    projects = httpx.get(f"{phoenix}/v1/projects", timeout=10).json()["data"]
    return str(next(p["id"] for p in projects if p["name"] == "default"))


def shoot(out: Path, chromium: str, workdir: Path) -> None:
    executable = subprocess.run(
        ["bash", str(ROOT / "scripts" / "phoenix.sh")], capture_output=True, text=True, check=True
    ).stdout.split()[-1]
    phoenix_port, api_port = free_port(), free_port()
    phoenix = f"http://127.0.0.1:{phoenix_port}"
    api = f"http://127.0.0.1:{api_port}"
    procs = []
    try:
        phoenix_env = _env(
            PHOENIX_WORKING_DIR=str(workdir),
            PHOENIX_HOST="127.0.0.1",
            PHOENIX_PORT=str(phoenix_port),
            PHOENIX_GRPC_PORT=str(free_port()),
            PHOENIX_TELEMETRY_ENABLED="false",
            PHOENIX_ALLOW_EXTERNAL_RESOURCES="false",
        )
        with (workdir / "phoenix.log").open("w") as log:
            procs.append(
                subprocess.Popen([executable, "serve"], env=phoenix_env, stdout=log, stderr=log)
            )
        _wait(lambda: httpx.get(f"{phoenix}/healthz").status_code == 200, 180, "Phoenix")
        stack_env = _env(
            OTEL_TRACES_EXPORTER="otlp",
            OTEL_EXPORTER_OTLP_ENDPOINT=phoenix,
            OTEL_BSP_SCHEDULE_DELAY="100",
        )
        with (workdir / "stack.log").open("w") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "cli", "run", "--port", str(api_port), "--workers", "1"],
                    env=stack_env,
                    stdout=log,
                    stderr=log,
                    cwd=ROOT,
                )
            )
        _wait(lambda: httpx.get(f"{api}/readyz").status_code == 200, 120, "the stack")
        trace_id = secrets.token_hex(16)
        _chat(api, f"00-{trace_id}-{secrets.token_hex(8)}-01")
        _wait(lambda: WANTED <= _spans(phoenix, trace_id), 60, f"the spans of {trace_id}")
        url = f"{phoenix}/projects/{_project_id(phoenix)}/traces/{trace_id}"
        subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                f"--user-data-dir={workdir / 'chromium'}",
                "--window-size=1600,1000",
                "--virtual-time-budget=15000",
                f"--screenshot={out.resolve()}",
                url,
            ],
            check=True,
            capture_output=True,
            timeout=180,
        )
        print(json.dumps({"trace_id": trace_id, "url": url, "screenshot": str(out)}))
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.trace_screenshot", description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "trace.png")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="llmq-trace-shot-") as workdir:
        shoot(args.out, args.chromium, Path(workdir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
