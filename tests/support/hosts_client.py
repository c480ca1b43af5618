"""A client program run on the cluster's client host.

Run as ``python -m tests.support.hosts_client``.

It prints one JSON object per line, flushed, so that the test watching its log
knows what it has received and when (``t`` is wall-clock time, which the test
shares: every host is on this machine).

- ``openai URL BODY``: stream a completion with the openai SDK (no retries).
- ``native URL1 URL2 BODY TIMEOUT``: submit on URL1 and follow its events; when
  no byte arrives for TIMEOUT seconds, reconnect to URL2 with ``Last-Event-ID``.
- ``load URL BODY N``: N concurrent openai streams of BODY with seeds 0..N-1.
- ``submit URL BODY SECONDS``: native submissions back to back for SECONDS; each
  answer (accepted id or refusal status) is one line.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import httpx
import openai

from tests.support.sse import frames


def emit(**fields: Any) -> None:
    print(json.dumps({"t": time.time(), **fields}), flush=True)


def run_openai(url: str, body: dict[str, Any]) -> None:
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=3.0)
    try:
        for chunk in client.completions.create(**body, stream=True):
            text = chunk.choices[0].text if chunk.choices else ""
            emit(id=chunk.id.split("-", 1)[1], text=text)
    except openai.APIError as exc:
        emit(error=type(exc).__name__, message=str(exc))
        return
    except Exception as exc:
        # A read timeout once the stream has begun comes unwrapped from the SDK's HTTP
        # library (httpx or, in openai 3, httpx2): the SDK's timeout all the same.
        if not any(c.__name__ == "TimeoutException" for c in type(exc).__mro__):
            raise
        emit(error=openai.APITimeoutError.__name__, message=str(exc))
        return
    emit(end=True)


async def run_native(url1: str, url2: str, body: dict[str, Any], timeout: float) -> None:
    async with httpx.AsyncClient(timeout=httpx.Timeout(5.0, read=timeout)) as client:
        r = await client.post(url1 + "/v1/requests", json=body)
        r.raise_for_status()
        rid = r.json()["id"]
        emit(id=rid)
        last = ""
        for url in (url1, url2, url2):
            headers = {"Last-Event-ID": last} if last else {}
            try:
                events = f"{url}/v1/requests/{rid}/events"
                async with client.stream("GET", events, headers=headers) as response:
                    async for frame in frames(response):
                        last = frame.id or last
                        emit(sse_id=frame.id, event=frame.event, data=frame.json())
                        if frame.event in ("done", "error"):
                            emit(end=True)
                            return
            except httpx.TransportError as exc:
                emit(switch=url2, last=last, error=type(exc).__name__)
        emit(error="gave up")


async def run_load(url: str, body: dict[str, Any], n: int) -> None:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)

    async def one(seed: int) -> None:
        try:
            async for chunk in await client.completions.create(**body, seed=seed, stream=True):
                text = chunk.choices[0].text if chunk.choices else ""
                emit(stream=seed, id=chunk.id.split("-", 1)[1], text=text)
        except openai.APIError as exc:
            emit(stream=seed, failed=type(exc).__name__, message=str(exc))
            return
        emit(stream=seed, finished=True)

    await asyncio.gather(*(one(seed) for seed in range(n)))
    emit(end=True)


async def run_submit(url: str, body: dict[str, Any], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(timeout=10) as client:
        while time.monotonic() < deadline:
            sent = time.time()
            try:
                r = await client.post(url + "/v1/requests", json=body)
            except httpx.TransportError as exc:
                emit(sent=sent, refused=type(exc).__name__)
                continue
            if r.status_code == 202:
                emit(sent=sent, accepted=r.json()["id"])
            else:
                emit(sent=sent, refused=r.status_code)
            await asyncio.sleep(0.05)
    emit(end=True)


def main(argv: list[str]) -> None:
    command, url, body = argv[0], argv[1], json.loads(argv[2]) if argv[0] != "native" else {}
    if command == "openai":
        run_openai(url, body)
    elif command == "load":
        asyncio.run(run_load(url, body, int(argv[3])))
    elif command == "submit":
        asyncio.run(run_submit(url, body, float(argv[3])))
    else:
        asyncio.run(run_native(url, argv[2], json.loads(argv[3]), float(argv[4])))


if __name__ == "__main__":
    main(sys.argv[1:])
