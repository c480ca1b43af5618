"""The floor through one Redis hop: what any Redis-stream relay can reach on this host.

llmq puts a Redis stream between the model and the API: that is what makes
streams resumable and the work queueable, and it costs CPU per token. Whether the
capacity target (llmq holding 80 % of the floor's streams, ``bench/scenarios/
capacity.py``) is reachable at all by *any* such design is bounded by this
server: the floor (:mod:`bench.floor`, everything of it kept) with every token
passed through Redis the cheapest way a queue design could.

- The model side (the same :class:`~worker.mock.MockBackend` step loop) appends
  each step's tokens, for all streams it advanced, in one round trip: one
  ``XADD key MAXLEN n * t TOKEN`` per token, packed by hiredis in C and written at
  once. Each response has its own stream key, bounded by ``MAXLEN`` and expiring
  ``ttl`` seconds after its first and its last entry.
- One reader task reads every active stream in one blocking ``XREAD`` (the raw
  reply, no per-entry dicts), hands each entry to its request, whose handler
  writes it as the floor's SSE chunk. A stream that starts while the read blocks
  wakes it through a control stream, written once per new stream.

No fencing, no Lua, no pydantic, no worker process, no reconnects or retries (a
lost Redis stops its streams): it is a bound, not a server to deploy. With
``--role api`` the model runs in a separate process (``--role model``), which
takes requests from a Redis list (one ``LPUSH`` per request) as llmq's workers
take them from its queue: the model process -> Redis -> API process hop count of
llmq. With ``--upstream URL`` that process streams each request from an
OpenAI-compatible inference server instead of running the mock
(:class:`UpstreamBackend`): every hop a request through llmq makes to a real
engine and back, and nothing else, which is what the first token through llmq is
compared with beside the server's own (``bench/scenarios/upstream.py``).

Run it with ``python -m bench.floor_via_redis --redis-url URL --port 8100`` (add
``--role api`` and start ``--role model`` beside it for two processes).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import signal
from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal, Protocol

import aiohttp
import hiredis
import uvloop
from pydantic_core import from_json
from redis.asyncio import Redis

from bench.floor import FloorApp, serve
from llmq.model.interface import Emit, GenerationRequest, Output
from llmq.sse import DONE, frames
from llmq.tasks import stop_tasks
from worker.mock import MockBackend

Role = Literal["both", "api", "model"]

#: Field names of a stream entry: a token's text, or the end of the response.
TOKEN, END = b"t", b"d"
#: How long one XREAD blocks before it is sent again (it is woken sooner by any entry).
BLOCK_MS = 1000
DEFAULT_PREFIX = "floor"
DEFAULT_MAXLEN = 1000
DEFAULT_TTL_S = 60


class Emitting(Protocol):
    """What the model's side runs: the mock, or an inference server (:class:`UpstreamBackend`)."""

    async def generate_into(self, request: GenerationRequest, emit: Emit) -> None: ...


class UpstreamBackend:
    """An OpenAI-compatible inference server as the floor's model: each request
    streamed from its ``/v1/completions``, each chunk's text emitted as it arrives.

    As lean as a worker in front of a server can be (one pooled aiohttp session, the
    chunk parsed by pydantic-core), and as quick to a first token as llmq's: an
    engine that closes every stream's connection (llama.cpp) gets the next one
    opened ahead by a health check, as llmq's adapter does, so that no request pays
    a handshake on the way to its first token.
    """

    def __init__(self, url: str, health_path: str = "/health") -> None:
        self.url = url.rstrip("/")
        self.health_path = health_path
        self._session: aiohttp.ClientSession | None = None
        self._ahead: set[asyncio.Task[None]] = set()

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))
        return self._session

    async def open_ahead(self) -> None:
        """A health check read whole: its connection stays in the pool for the next stream."""
        try:
            async with self._http().get(self.url + self.health_path) as response:
                await response.read()
        except (aiohttp.ClientError, TimeoutError):
            pass  # the next stream connects itself

    async def generate_into(self, request: GenerationRequest, emit: Emit) -> None:
        body = {
            "prompt": request.prompt,
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "seed": request.seed % 2**31,
            "stream": True,
        }
        try:
            async with self._http().post(self.url + "/v1/completions", json=body) as response:
                response.raise_for_status()
                async for frame in frames(response.content.iter_any()):
                    if frame.data.strip() == DONE:
                        break
                    for choice in from_json(frame.data).get("choices") or ():
                        if text := choice.get("text"):
                            emit(text)
                response.close()  # the server closes it: keep it out of the pool
        finally:
            task = asyncio.create_task(self.open_ahead())
            self._ahead.add(task)
            task.add_done_callback(self._ahead.discard)

    async def aclose(self) -> None:
        await stop_tasks(list(self._ahead), timeout=5)
        if self._session is not None:
            await self._session.close()
            self._session = None


def _pack(command: tuple[Any, ...]) -> bytes:
    """One command in Redis's protocol, packed by hiredis (in C)."""
    packed: bytes = hiredis.pack_command(command)
    return packed


class Keys:
    """The Redis keys of one server: a stream per response, the control stream, requests."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.control = f"{prefix}:control".encode()
        self.requests = f"{prefix}:requests"

    def stream(self, stream_id: str) -> bytes:
        return f"{self.prefix}:s:{stream_id}".encode()


class Background:
    """A loop (``_forever``) run as one task from ``start`` until ``stop``."""

    _task: asyncio.Task[None] | None = None

    async def _forever(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._task = asyncio.create_task(self._forever())

    async def stop(self) -> None:
        if self._task is not None:
            await stop_tasks([self._task], timeout=5)
            self._task = None


class Producer(Background):
    """The model's side: each step's tokens, for every stream, in one round trip.

    The mock's step loop emits every due token synchronously; the emits only queue
    a command, and the flusher task, woken once after the step, sends everything
    queued in one write and reads the replies. What arrives while a write is in
    flight goes in the next one, so each stream's entries stay in order.
    """

    def __init__(self, redis: Redis, model: Emitting, keys: Keys, maxlen: int, ttl: int) -> None:
        self._redis = redis
        self._model = model
        self._keys = keys
        self._maxlen = str(maxlen).encode()
        self._ttl = str(ttl).encode()
        self._queued: list[bytes] = []
        self._count = 0
        self._wake = asyncio.Event()

    def _queue(self, *commands: tuple[bytes, ...]) -> None:
        self._queued.extend(_pack(c) for c in commands)
        self._count += len(commands)
        self._wake.set()

    async def generate(self, request: GenerationRequest, stream_id: str) -> None:
        """Run ``request``, each token appended to the stream of ``stream_id``, then its end."""
        key = self._keys.stream(stream_id)
        head = (b"XADD", key, b"MAXLEN", self._maxlen, b"*")
        expire = (b"EXPIRE", key, self._ttl)
        first = True

        def emit(token: Output) -> None:
            nonlocal first
            if not isinstance(token, str):
                return  # a report of the model's cache: not a token
            self._queued.append(_pack((*head, TOKEN, token)))
            self._count += 1
            if first:  # the key exists now: it expires even if the end is never written
                first = False
                self._queued.append(_pack(expire))
                self._count += 1
            self._wake.set()

        self._queue((b"XADD", self._keys.control, b"MAXLEN", b"1", b"*", b"new", key))
        try:
            await self._model.generate_into(request, emit)
        finally:
            self._queue((*head, END, b"1"), expire)

    async def _forever(self) -> None:
        """Send what is queued, one round trip per wake-up."""
        pool = self._redis.connection_pool
        connection = await pool.get_connection()
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                queued, count = self._queued, self._count
                self._queued, self._count = [], 0
                await connection.send_packed_command(b"".join(queued), check_health=False)
                for _ in range(count):
                    await connection.read_response()
        finally:
            await pool.release(connection)


class Inbox:
    """One request's entries, as the reader hands them over: its handler's wake-up."""

    __slots__ = ("last", "ready", "waiter")

    def __init__(self) -> None:
        self.last = b"0-0"
        self.ready: collections.deque[list[bytes]] = collections.deque()
        self.waiter: asyncio.Future[None] | None = None

    def offer(self, fields: list[bytes]) -> None:
        self.ready.append(fields)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def tokens(self) -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        while True:
            while self.ready:
                fields = self.ready.popleft()
                if fields[0] == END:
                    return
                yield fields[1].decode()
            self.waiter = loop.create_future()
            await self.waiter


class Reader(Background):
    """One task reading every active stream in one blocking XREAD, again and again."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys
        self._inboxes: dict[bytes, Inbox] = {}
        self._active = asyncio.Event()

    def open(self, key: bytes) -> Inbox:
        inbox = self._inboxes[key] = Inbox()
        self._active.set()
        return inbox

    def close(self, key: bytes) -> None:
        del self._inboxes[key]
        if not self._inboxes:
            self._active.clear()

    def _command(self) -> bytes:
        keys = [self._keys.control, *self._inboxes]
        ids = [b"$", *(inbox.last for inbox in self._inboxes.values())]
        return _pack((b"XREAD", b"BLOCK", str(BLOCK_MS).encode(), b"STREAMS", *keys, *ids))

    async def _forever(self) -> None:
        pool = self._redis.connection_pool
        connection = await pool.get_connection()
        try:
            while True:
                await self._active.wait()
                await connection.send_packed_command(self._command(), check_health=False)
                reply: list[list[Any]] | None = await connection.read_response()
                for key, entries in reply or ():
                    inbox = self._inboxes.get(key)
                    if inbox is None:  # the control stream, or a request that went away
                        continue
                    for _, fields in entries:
                        inbox.offer(fields)
                    inbox.last = entries[-1][0]
        finally:
            await pool.release(connection)


class FloorViaRedis(FloorApp):
    """The floor whose tokens pass through Redis: ``role`` "both" runs the model here,
    "api" hands each request to a ``--role model`` process through Redis."""

    def __init__(
        self,
        model: MockBackend,
        redis_url: str,
        *,
        role: Role = "both",
        prefix: str = DEFAULT_PREFIX,
        maxlen: int = DEFAULT_MAXLEN,
        ttl: int = DEFAULT_TTL_S,
    ) -> None:
        super().__init__(model)
        self.role = role
        self.keys = Keys(prefix)
        self.redis = Redis.from_url(redis_url)
        self.reader = Reader(self.redis, self.keys)
        self.producer = Producer(self.redis, model, self.keys, maxlen, ttl)

    async def startup(self) -> None:
        self.reader.start()
        if self.role == "both":
            self.producer.start()

    async def shutdown(self) -> None:
        await self.reader.stop()
        await self.producer.stop()
        await self.redis.aclose()

    async def tokens(self, request: GenerationRequest, stream_id: str) -> AsyncIterator[Output]:
        key = self.keys.stream(stream_id)
        inbox = self.reader.open(key)
        generation: asyncio.Task[None] | None = None
        try:
            if self.role == "both":
                generation = asyncio.create_task(self.producer.generate(request, stream_id))
            else:
                await self.redis.lpush(self.keys.requests, _encode_request(request, stream_id))
            async for token in inbox.tokens():
                yield token
        finally:
            self.reader.close(key)
            if generation is not None and not generation.done():
                generation.cancel()  # the client went away: stop the sequence


def _encode_request(request: GenerationRequest, stream_id: str) -> str:
    return json.dumps(
        {
            "id": stream_id,
            "prompt": request.prompt,
            "max_tokens": request.max_tokens,
            "seed": request.seed,
            "prompt_tokens": request.prompt_tokens,
            "temperature": request.temperature,
        }
    )


def _decode_request(raw: bytes) -> tuple[GenerationRequest, str]:
    body = json.loads(raw)
    request = GenerationRequest(
        prompt=body["prompt"],
        max_tokens=body["max_tokens"],
        seed=body["seed"],
        prompt_tokens=body["prompt_tokens"],
        temperature=body["temperature"],
    )
    return request, str(body["id"])


async def serve_model(
    model: Emitting,
    redis_url: str,
    *,
    prefix: str = DEFAULT_PREFIX,
    maxlen: int = DEFAULT_MAXLEN,
    ttl: int = DEFAULT_TTL_S,
    stop: asyncio.Event | None = None,
) -> None:
    """The model process: take requests from the list, stream their tokens, until ``stop``."""
    keys = Keys(prefix)
    redis = Redis.from_url(redis_url)
    producer = Producer(redis, model, keys, maxlen, ttl)
    producer.start()
    running: set[asyncio.Task[None]] = set()
    stopping = stop or asyncio.Event()
    try:
        while not stopping.is_set():
            popped = await redis.brpop([keys.requests], timeout=1)
            if popped is None:
                continue
            request, stream_id = _decode_request(popped[1])
            task = asyncio.create_task(producer.generate(request, stream_id))
            running.add(task)
            task.add_done_callback(running.discard)
    finally:
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        await producer.stop()
        await redis.aclose()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.floor_via_redis", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--role", choices=("both", "api", "model"), default="both")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--tokens-per-second", type=float, default=50.0)
    parser.add_argument("--prefill-seconds-per-token", type=float, default=0.0001)
    parser.add_argument("--prefix", default=DEFAULT_PREFIX, help="of every Redis key")
    parser.add_argument("--maxlen", type=int, default=DEFAULT_MAXLEN, help="entries per stream")
    parser.add_argument("--ttl", type=int, default=DEFAULT_TTL_S, help="seconds a stream lives")
    parser.add_argument(
        "--upstream",
        metavar="URL",
        help="with --role model: stream from this OpenAI-compatible server, not the mock",
    )
    return parser


def _run_model(args: argparse.Namespace, model: Emitting) -> None:
    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        if isinstance(model, UpstreamBackend):
            await model.open_ahead()
        try:
            await serve_model(
                model,
                args.redis_url,
                prefix=args.prefix,
                maxlen=args.maxlen,
                ttl=args.ttl,
                stop=stop,
            )
        finally:
            if isinstance(model, UpstreamBackend):
                await model.aclose()

    uvloop.run(main())


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.upstream and args.role != "model":
        parser.error("--upstream is the model's: give it with --role model")
    if args.upstream:
        _run_model(args, UpstreamBackend(args.upstream))
        return
    model = MockBackend(
        tokens_per_second=args.tokens_per_second,
        prefill_seconds_per_token=args.prefill_seconds_per_token,
    )
    if args.role == "model":
        _run_model(args, model)
        return
    app = FloorViaRedis(
        model,
        args.redis_url,
        role=args.role,
        prefix=args.prefix,
        maxlen=args.maxlen,
        ttl=args.ttl,
    )
    serve(app, args.host, args.port)


if __name__ == "__main__":
    main()
