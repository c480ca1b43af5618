"""The campaign's clients: native streams that reconnect to any API with
``Last-Event-ID``, and OpenAI streams; some cancel at a random moment. Each sends
its tenant in the ``X-Tenant`` header (the APIs run with ``LLMQ_TENANT_HEADER``),
and like a load balancer tries another API when one refuses the connection (nothing
reached it: a stopped or restarting process).

Each client fills in its :class:`bench.chaos.history.Request` as things arrive and
never raises: whatever happens becomes the request's outcome. Streams are read
with the project's one SSE reader (:func:`loadgen.sse.frames`).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from bench.chaos.history import Request
from loadgen.sse import DONE, frames

#: A native stream idle this long (the APIs send keep-alives every second) is
#: taken for a dead or cut-off API: the client reconnects to another.
NATIVE_IDLE_SECONDS = 4.0
#: An OpenAI stream cannot move: it waits out a stalled API up to this long.
OPENAI_IDLE_SECONDS = 15.0
RECONNECT_PAUSE = 0.2
#: An error event that ends one connection, not the request.
SHUTTING_DOWN = "shutting_down"
#: The header that names a request's tenant (the APIs' ``tenant_header``).
TENANT_HEADER = "X-Tenant"


@dataclass
class Clients:
    """What the clients share: the API URLs, campaign clock, and their deadline."""

    apis: Sequence[str]
    started: float
    #: Campaign seconds after which a client stops waiting (its outcome: ``hung``).
    deadline: float = float("inf")

    def now(self) -> float:
        return time.monotonic() - self.started

    def body(self, r: Request) -> dict[str, Any]:
        return {
            "model": "mock",
            "prompt": r.spec.prompt,
            "max_tokens": r.spec.max_tokens,
            "seed": r.spec.seed,
            "ignore_eos": True,
        }

    async def run(self, r: Request, rng: random.Random) -> None:
        """Run ``r``'s client to its end, within the deadline."""
        timeout = httpx.Timeout(5.0, connect=2.0, read=None)
        async with httpx.AsyncClient(timeout=timeout) as http:
            try:
                async with asyncio.timeout(max(0.0, self.deadline - self.now())):
                    if r.spec.kind == "native":
                        await self._native(http, r, rng)
                    else:
                        await self._openai(http, r, rng)
            except TimeoutError:
                r.outcome = "hung"
            except Exception as exc:  # a client bug must not pass for a system's fault
                r.outcome, r.error = "hung", f"client failed: {type(exc).__name__}: {exc}"
        if r.ended_at is None:
            r.ended_at = self.now()

    def _arrived(self, r: Request, last: float, *, token: bool = True) -> float:
        now = self.now()
        r.stall = max(r.stall, now - last)
        if token and r.first_token_at is None:
            r.first_token_at = now
        return now

    def headers(self, r: Request) -> dict[str, str]:
        return {TENANT_HEADER: r.spec.tenant} if r.spec.tenant else {}

    def _refused(self, r: Request, response: httpx.Response) -> None:
        r.refused_status = response.status_code
        r.retry_after = response.headers.get("retry-after")
        r.error = f"HTTP {response.status_code}: {response.text[:200]}"
        self._end(r, "refused")

    def _end(self, r: Request, outcome: Any) -> None:
        r.outcome, r.ended_at = outcome, self.now()

    async def _apis(self, rng: random.Random) -> AsyncIterator[str]:
        """The APIs in a random order, round after round for 15 s (a pause between
        rounds): a client goes on to the next while one refuses the connection."""
        apis = list(self.apis)
        rng.shuffle(apis)
        deadline = self.now() + 15.0
        while self.now() < deadline:
            for url in apis:
                yield url
            await asyncio.sleep(RECONNECT_PAUSE)

    async def _submit(self, http: httpx.AsyncClient, r: Request, rng: random.Random) -> bool:
        """POST to APIs in random order until one answers; False if none accepted."""
        async for url in self._apis(rng):
            try:
                response = await http.post(
                    url + "/v1/requests", json=self.body(r), headers=self.headers(r)
                )
            except (httpx.ConnectError, httpx.ConnectTimeout):  # nothing was sent
                continue  # nothing reached the API: safe to try another
            except httpx.TransportError as exc:
                self._end(r, "unknown")
                r.error = f"submission's answer lost: {type(exc).__name__}"
                return False
            if response.status_code == 202:
                r.request_id, r.api = str(response.json()["id"]), url
                return True
            if response.status_code >= 500 and response.status_code != 503:
                continue
            self._refused(r, response)
            return False
        self._end(r, "refused")
        r.error = "no API answered"
        return False

    async def _cancel(self, http: httpx.AsyncClient, r: Request, rng: random.Random) -> None:
        assert r.spec.cancel_after is not None
        await asyncio.sleep(r.spec.cancel_after)
        while r.outcome is None:
            url = rng.choice(list(self.apis))
            # Set before sending: the request may end cancelled before the answer comes.
            r.cancelled = True
            try:
                response = await http.delete(
                    f"{url}/v1/requests/{r.request_id}", headers=self.headers(r)
                )
                if response.status_code == 200:
                    return
            except (httpx.ConnectError, httpx.ConnectTimeout):  # nothing was sent
                r.cancelled = False  # it never left
            except httpx.HTTPError:
                pass  # it may have been applied: the request may end cancelled
            await asyncio.sleep(RECONNECT_PAUSE)

    async def _native(self, http: httpx.AsyncClient, r: Request, rng: random.Random) -> None:
        if not await self._submit(http, r, rng):
            return
        canceller = None
        if r.spec.cancel_after is not None:
            canceller = asyncio.create_task(self._cancel(http, r, rng))
        try:
            await self._follow(http, r, rng)
        finally:
            if canceller is not None:
                canceller.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await canceller

    async def _follow(self, http: httpx.AsyncClient, r: Request, rng: random.Random) -> None:
        """Read the request's events from any API, resuming after the last id seen."""
        last_id, last = "", r.submitted_at
        timeout = httpx.Timeout(5.0, connect=2.0, read=NATIVE_IDLE_SECONDS)
        while True:
            url = rng.choice(list(self.apis))
            headers = {**self.headers(r), **({"Last-Event-ID": last_id} if last_id else {})}
            events = f"{url}/v1/requests/{r.request_id}/events"
            try:
                async with http.stream("GET", events, headers=headers, timeout=timeout) as resp:
                    if resp.status_code != 200:
                        await resp.aread()
                        r.error = f"events: HTTP {resp.status_code}: {resp.text[:200]}"
                    else:
                        async for frame in frames(resp.aiter_bytes()):
                            last_id = frame.id or last_id
                            data = frame.json()
                            if frame.event == "tokens":
                                r.events.append((int(data["index"]), list(data["tokens"])))
                                last = self._arrived(r, last)
                            elif frame.event == "done" or (
                                frame.event == "error" and data.get("code") != SHUTTING_DOWN
                            ):
                                r.error_code = str(data.get("code") or "")
                                r.finish_reason = data.get("finish_reason")
                                usage = data.get("usage") or {}
                                r.usage_tokens = usage.get("completion_tokens")
                                self._end(r, "done" if frame.event == "done" else "error")
                                return
            except httpx.TransportError as exc:
                r.error = f"events: {type(exc).__name__}"
            r.reconnects += 1
            await asyncio.sleep(RECONNECT_PAUSE)

    async def _openai(self, http: httpx.AsyncClient, r: Request, rng: random.Random) -> None:
        async for url in self._apis(rng):
            try:
                await self._openai_stream(http, r, url)
                return
            except (httpx.ConnectError, httpx.ConnectTimeout):  # nothing was sent
                continue  # nothing reached the API: safe to try another
        r.error = "no API answered"
        self._end(r, "refused")

    async def _openai_stream(self, http: httpx.AsyncClient, r: Request, url: str) -> None:
        """One streaming completion on ``url``; raises ``ConnectError`` only if the
        connection was refused (nothing sent)."""
        body = {**self.body(r), "stream": True, "stream_options": {"include_usage": True}}
        timeout = httpx.Timeout(5.0, connect=2.0, read=OPENAI_IDLE_SECONDS)
        cancel_at = None
        if r.spec.cancel_after is not None:
            cancel_at = r.submitted_at + r.spec.cancel_after
        last = r.submitted_at
        cancel_timer = asyncio.timeout_at(_loop_time(cancel_at, self))
        try:
            async with http.stream(
                "POST", url + "/v1/completions", json=body, headers=self.headers(r), timeout=timeout
            ) as resp:
                r.api = url
                if resp.status_code != 200:
                    await resp.aread()
                    if resp.status_code in (429, 503):
                        self._refused(r, resp)
                    else:
                        r.error = f"HTTP {resp.status_code}: {resp.text[:200]}"
                        self._end(r, "error")
                    return
                async with cancel_timer:
                    async for frame in frames(resp.aiter_bytes()):
                        if frame.data == DONE:
                            self._end(r, "error" if r.error else "done")
                            return
                        self._chunk(r, frame.json())
                        last = self._arrived(r, last, token=bool(r.text))
        except TimeoutError:
            if not cancel_timer.expired():
                raise  # the campaign's deadline, not this client's cancel
            r.cancelled = True  # the client closes the connection: a cancel
            self._end(r, "cut")
            return
        except httpx.ConnectError:
            if not r.api:
                raise
            r.error = "ConnectError"
        except (httpx.TransportError, ValueError) as exc:
            r.error = f"{type(exc).__name__}: {exc}"
        self._end(r, "cut")

    def _chunk(self, r: Request, chunk: dict[str, Any]) -> None:
        if "error" in chunk:
            r.error = str(chunk["error"])[:300]
            r.error_code = str((chunk["error"] or {}).get("code") or "")
            return
        r.request_id = r.request_id or str(chunk["id"]).split("-", 1)[1]
        if chunk.get("usage"):
            r.usage_tokens = int(chunk["usage"]["completion_tokens"])
        for choice in chunk.get("choices") or []:
            r.text += choice.get("text") or ""
            if choice.get("finish_reason"):
                r.finish_reason = choice["finish_reason"]


def _loop_time(at: float | None, clients: Clients) -> float | None:
    """Campaign seconds ``at`` as the running loop's time (None: no deadline)."""
    if at is None:
        return None
    return asyncio.get_running_loop().time() + (at - clients.now())
