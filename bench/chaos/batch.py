"""Batches through the Batch API beside the campaign's clients, under the same faults.

One after another throughout the campaign (:func:`throughout`): each is created
through whichever API host answers, awaited, and its output and error files read
back line by line into the history, where the checker's ``batch`` rule wants every
``custom_id`` once with the undisturbed run's text and no line failed; the next is
made once it ended, until the faults stop (the last one is awaited within the
campaign's bound). The batches are the default tenant's (no ``X-Tenant``).
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable, Sequence
from typing import Any

import httpx
from redis.asyncio import Redis

from bench.chaos.checker import batch_custom_id
from bench.chaos.history import BatchRun, Spec
from llmq.protocol import keys

#: The first spec number of a batch line (the clients' requests are numbered from 0).
FIRST_LINE = 100_000
ENDED = ("completed", "failed", "expired", "cancelled")


def batch_specs(seed: int, lines: int, max_tokens: tuple[int, int], number: int = 0) -> list[Spec]:
    """The lines of the campaign's ``number``-th batch."""
    rng = random.Random(f"batch:{seed}:{number}")
    first = FIRST_LINE + number * lines
    return [
        Spec(
            n=first + i,
            kind="openai",
            seed=rng.randrange(1 << 30),
            prompt=f"chaos {seed} batch line {first + i}",
            max_tokens=rng.randint(*max_tokens),
        )
        for i in range(lines)
    ]


async def throughout(
    apis: Sequence[str],
    seed: int,
    lines: int,
    max_tokens: tuple[int, int],
    now: Callable[[], float],
    stop: asyncio.Event,
    bound: float,
    into: list[BatchRun],
) -> None:
    """Batches one after another into ``into`` until ``stop`` is set; the one running
    then is awaited for ``bound`` seconds more."""
    number = 0
    while True:
        run = await submit(apis, batch_specs(seed, lines, max_tokens, number))
        run.created_at = now()
        into.append(run)
        collecting = asyncio.ensure_future(collect(apis, run, None))
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({collecting, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if not collecting.done() and not (await asyncio.wait({collecting}, timeout=bound))[0]:
            collecting.cancel()
            await asyncio.gather(collecting, return_exceptions=True)
            run.error = f"not ended {bound:g} s after the faults stopped (status {run.status})"
        run.ended_at = now()
        number += 1
        if stop.is_set() or run.error:
            return


def _line(spec: Spec) -> str:
    body = {
        "model": "mock",
        "prompt": spec.prompt,
        "max_tokens": spec.max_tokens,
        "seed": spec.seed,
        "ignore_eos": True,
    }
    line = {"custom_id": batch_custom_id(spec), "method": "POST", "url": "/v1/completions"}
    return json.dumps({**line, "body": body})


async def _any(apis: Sequence[str], method: str, path: str, **kwargs: Any) -> httpx.Response:
    """The first answer of any API host (each tried in turn, a few rounds)."""
    failure = ""
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0, connect=2.0)) as http:
        for _ in range(10):
            for api in apis:
                try:
                    response = await http.request(method, api + path, **kwargs)
                except httpx.HTTPError as exc:
                    failure = f"{type(exc).__name__}: {exc}"
                    continue
                if response.status_code < 500:
                    return response
                failure = f"{response.status_code}: {response.text[:200]}"
            await asyncio.sleep(0.5)
    raise RuntimeError(f"no API answered {method} {path}: {failure}")


async def submit(apis: Sequence[str], specs: list[Spec]) -> BatchRun:
    run = BatchRun(specs=specs)
    content = "".join(_line(spec) + "\n" for spec in specs)
    try:
        uploaded = await _any(
            apis,
            "POST",
            "/v1/files",
            files={"file": ("in.jsonl", content)},
            data={"purpose": "batch"},
        )
        uploaded.raise_for_status()
        created = await _any(
            apis,
            "POST",
            "/v1/batches",
            json={
                "input_file_id": uploaded.json()["id"],
                "endpoint": "/v1/completions",
                "completion_window": "24h",
            },
        )
        created.raise_for_status()
        run.batch_id = created.json()["id"]
    except (RuntimeError, httpx.HTTPError) as exc:
        run.error = f"the batch could not be made: {exc}"
    return run


async def collect(apis: Sequence[str], run: BatchRun, timeout: float | None) -> None:
    """Wait for the batch to end (at most ``timeout`` s; None: for as long as it
    takes), then read its files."""
    if not run.batch_id:
        return
    try:
        async with asyncio.timeout(timeout):
            while True:
                got = (await _any(apis, "GET", f"/v1/batches/{run.batch_id}")).json()
                run.status = got["status"]
                if run.status in ENDED:
                    break
                await asyncio.sleep(0.5)
        for field, into in (("output_file_id", run.output), ("error_file_id", run.errors)):
            if got.get(field):
                text = (await _any(apis, "GET", f"/v1/files/{got[field]}/content")).text
                lines = [json.loads(raw) for raw in text.splitlines()]
                into += [_entry(line, field) for line in lines]
                run.tokens += sum(_tokens(line) for line in lines)
                run.line_tokens += [
                    (str(line["response"]["request_id"]), _tokens(line))
                    for line in lines
                    if field == "output_file_id"
                ]
    except (TimeoutError, RuntimeError, httpx.HTTPError, ValueError) as exc:
        run.error = f"the batch could not be read back: {type(exc).__name__}: {exc}"


async def read_finished(redis: Redis, run: BatchRun, started_unix: float) -> None:
    """Each output line's ``finished_at`` from its request's record, in campaign seconds
    (a record without one is left out)."""
    pipe = redis.pipeline(transaction=False)
    for request_id, _ in run.line_tokens:
        pipe.hget(keys.request(request_id), "finished_at")
    for (request_id, _), raw in zip(run.line_tokens, await pipe.execute(), strict=True):
        if raw is not None:
            run.finished[request_id] = float(raw) - started_unix


def _tokens(line: dict[str, Any]) -> int:
    """Prompt + completion tokens of an output line (none for an error line)."""
    usage = ((line.get("response") or {}).get("body") or {}).get("usage") or {}
    return int(usage.get("prompt_tokens") or 0) + int(usage.get("completion_tokens") or 0)


def _entry(line: dict[str, Any], field: str) -> tuple[str, str]:
    response = line.get("response") or {}
    if field == "error_file_id":
        code = (line.get("error") or {}).get("code") or f"status {response.get('status_code')}"
        return line["custom_id"], str(code)
    return line["custom_id"], str(response["body"]["choices"][0]["text"])
