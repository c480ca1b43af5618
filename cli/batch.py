"""``llmq batch FILE --endpoint ... -o OUT``: run a JSONL file through the Batch API.

For people who do not write code: it uploads the file, creates the batch, shows a
progress bar on stderr while it runs (a terminal line redrawn in place, or one line per
change where stderr is not a terminal), and writes the output file (and the error
file, ``OUT.errors.jsonl``, if any line failed). Ctrl-C cancels the batch and writes
what finished. Exit status: 0 when every line succeeded, 1 when some failed or the
batch did not complete, 2 when it could not be made.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    import httpx

ENDED = frozenset({"completed", "failed", "expired", "cancelled"})
BAR_WIDTH = 30


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, help="the JSONL input file (one request per line)")
    parser.add_argument(
        "--endpoint",
        required=True,
        help="/v1/chat/completions, /v1/completions, /v1/embeddings or /v1/responses",
    )
    parser.add_argument("-o", "--output", type=Path, required=True, help="where the output goes")
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the llmq API")
    parser.add_argument(
        "--api-key", default=os.environ.get("OPENAI_API_KEY", ""), help="(default: $OPENAI_API_KEY)"
    )
    parser.add_argument("--completion-window", default="24h")
    parser.add_argument("--poll-seconds", type=float, default=0.5)


def bar(batch: dict[str, Any]) -> str:
    counts = batch.get("request_counts") or {}
    total = counts.get("total", 0) or 0
    done = (counts.get("completed", 0) or 0) + (counts.get("failed", 0) or 0)
    filled = BAR_WIDTH * done // total if total else 0
    failed = f", {counts.get('failed', 0)} failed" if counts.get("failed") else ""
    return f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {done}/{total} {batch['status']}{failed}"


class _Progress:
    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.live = out.isatty()
        self.last = ""

    def show(self, batch: dict[str, Any]) -> None:
        line = bar(batch)
        if line == self.last:
            return
        self.last = line
        print(f"\r{line}" if self.live else line, end="" if self.live else "\n", file=self.out)
        self.out.flush()

    def close(self) -> None:
        if self.live and self.last:
            print(file=self.out)


def _fail(response: httpx.Response, what: str) -> None:
    if response.status_code >= 400:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text
        raise SystemExit(f"llmq batch: {what} failed ({response.status_code}): {message}")


async def _download(client: httpx.AsyncClient, file_id: str | None, path: Path) -> None:
    if file_id:
        response = await client.get(f"/v1/files/{file_id}/content")
        _fail(response, "downloading the output")
        path.write_bytes(response.content)


async def run_batch(args: argparse.Namespace, err: TextIO = sys.stderr) -> int:
    import httpx  # here: the parser is built by every llmq process

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    async with httpx.AsyncClient(base_url=args.url, headers=headers, timeout=60) as client:
        content = args.file.read_bytes()
        uploaded = await client.post(
            "/v1/files", files={"file": (args.file.name, content)}, data={"purpose": "batch"}
        )
        _fail(uploaded, "uploading the file")
        created = await client.post(
            "/v1/batches",
            json={
                "input_file_id": uploaded.json()["id"],
                "endpoint": args.endpoint,
                "completion_window": args.completion_window,
            },
        )
        _fail(created, "creating the batch")
        batch = created.json()
        progress = _Progress(err)
        try:
            while batch["status"] not in ENDED:
                progress.show(batch)
                await asyncio.sleep(args.poll_seconds)
                polled = await client.get(f"/v1/batches/{batch['id']}")
                _fail(polled, "reading the batch")
                batch = polled.json()
        except (KeyboardInterrupt, asyncio.CancelledError):
            await client.post(f"/v1/batches/{batch['id']}/cancel")
            raise
        progress.show(batch)
        progress.close()
        for error in (batch.get("errors") or {}).get("data", []):
            print(f"line {error.get('line')}: {error['code']}: {error['message']}", file=err)
        await _download(client, batch.get("output_file_id"), args.output)
        errors = args.output.with_name(args.output.name + ".errors.jsonl")
        await _download(client, batch.get("error_file_id"), errors)
    counts = batch.get("request_counts") or {}
    if batch["status"] == "failed":
        return 2
    return 0 if batch["status"] == "completed" and not counts.get("failed") else 1
