"""The model as an OpenAI-compatible inference server beside the worker (its upstream).

One worker drives one upstream (a sidecar, as a GPU pod runs one engine); more
workers with their own upstreams scale the model out. The adapter is thin and
assumes only this of the upstream:

- ``POST /v1/completions`` with ``stream: true`` streams SSE chunks, one token's text
  per chunk (``choices[0].text``; a chunk with no text is not a token), the last one
  with ``finish_reason``, then (with ``stream_options.include_usage``, where honoured)
  one with ``usage``; llmq counts a chunk as a token, so ``max_tokens`` and resumes
  count in chunks, except where the engine says how many tokens a chunk carries
  (:meth:`~worker.backends.engines.Engine.ask_token_counts`: vLLM lists their ids,
  llama.cpp keeps a running count; a chunk can carry several tokens, or none with
  text): then by that (:func:`_per_token`);
- the upstream aborts a sequence when its client disconnects (vLLM and llama.cpp
  do): closing the response is how a cancelled, timed-out or fenced request frees
  its slot;
- greedy decoding (temperature 0) of ``prompt + generated text`` continues the
  interrupted sequence: a re-run resumes by sending the prompt followed by the text
  already published, with the remaining ``max_tokens`` (see ``docs/backends.md``
  for the engines and tokenizers where the result equals an uninterrupted run);
- with ``chat`` (wherever the engine has a chat template, found at :meth:`connect`,
  unless ``LLMQ_UPSTREAM_API`` says otherwise), ``/v1/chat/completions`` streams
  ``choices[0].delta.content`` likewise, and continues a final assistant message
  (``continue_final_message``); an engine that echoes the continued text first
  (llama.cpp) has it dropped;
- with ``tools`` declared, the chat API takes ``tools``, ``tool_choice`` and
  ``parallel_tool_calls: false`` and streams a call as ``delta.tool_calls``: the
  first delta of a call has its ``id`` and ``function.name``, the following ones
  pieces of ``function.arguments`` (one token each, as text). llmq relays one call
  per choice; a re-run of a request that offers tools replays the sequence from its
  start rather than continuing it (no engine continues a half-written call), and
  passes on what follows the published tokens (:func:`_after_published`).

Its tokenizer is declared as ``chars`` (the API's approximation); the upstream
counts exactly: the prompt's true count comes back in a :class:`Report`, and a
prompt that might not fit is counted with the engine's ``/tokenize`` first, so that
one over the context length ends as ``context_length_exceeded``. Errors are mapped
in one place (:func:`_raise_for`): a 4xx, before the stream or as an error event in
it, is the request's fault and ends it with the upstream's message
(:class:`Refused`: the client gets a 400); a 5xx, a refused or dropped connection
or a stall is the upstream's (:class:`UpstreamDown`), and the attempt is retried.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

import aiohttp
from pydantic_core import from_json

from llmq import tracing
from llmq.model.interface import (
    GenerationRequest,
    Output,
    Refused,
    Report,
    Token,
    ToolCallStart,
    message_text,
)
from llmq.model.tokenizer import CHARS
from llmq.policy.derived import PREFIX_CACHES
from llmq.schema import TokenLogprob
from llmq.sse import DONE, frames
from llmq.stale_connections import STALE_RETRIES, unsent
from llmq.tasks import stop_tasks
from worker.backends.engines import ENGINES, Engine, identify

log = logging.getLogger(__name__)

#: Connections beyond the slots: a probe and a tokenize beside every stream.
SPARE_CONNECTIONS = 4

#: What a failed exchange with the upstream raises: aiohttp's errors (a refused or
#: dropped connection, a bad answer) and its timeouts (a stall).
HTTP_ERRORS = (aiohttp.ClientError, TimeoutError)


class UpstreamDown(Exception):
    """The upstream did not answer as a server should: the attempt fails and is retried."""


class ReplayDiverged(Exception):
    """A re-run's replay wrote other tokens than those already published: the attempt
    fails (retried up to ``LLMQ_MAX_TRIES``) rather than splice two different outputs."""


def _raise_for(status: int, body: bytes) -> None:
    """The one place an upstream's error status becomes llmq's error."""
    if status < 400:
        return
    message = body.decode(errors="replace")[:500]
    code, param = "upstream_error", None
    try:
        error = json.loads(body).get("error", {})
    except (ValueError, AttributeError):
        error = {}
    if isinstance(error, dict):
        message = str(error.get("message") or message)
        named = error.get("code")  # llama.cpp's is the status, a number
        code = str(named if isinstance(named, str) and named else error.get("type") or code)
        param = error.get("param")
    elif isinstance(error, str):
        message = error
    if status >= 500 or status in (408, 429):
        # the server's state, not the request: another attempt (elsewhere) may succeed
        raise UpstreamDown(f"upstream answered {status}: {message}")
    if "context" in message.lower() and ("length" in message.lower() or "size" in message.lower()):
        code = "context_length_exceeded"
    raise Refused(f"upstream refused the request ({status}): {message}", code=code, param=param)


class OpenAIUpstream:
    """A :class:`~llmq.model.interface.Backend` that streams from an upstream server.

    :meth:`connect` asks the upstream what it serves (model, slots, context length,
    capabilities) where the settings leave it open (``capabilities`` None); ``on_down``
    hears at once of every failure of the upstream, so that the worker stops claiming
    before a health probe confirms.
    """

    tokenizer = "chars"

    def __init__(
        self,
        url: str,
        engine: Engine | None,
        *,
        model: str = "",
        api_key: str = "",
        slots: int = 0,
        queued: int = 0,
        context_length: int = 0,
        capabilities: frozenset[str] | None = None,
        timeout: float = 30.0,
        chat: bool | None = False,
    ) -> None:
        self.url = url.rstrip("/")
        #: The engine, named by the settings or (None) identified at :meth:`connect`.
        self.engine = engine or ENGINES["generic"]
        self.identified = engine is None
        self.model = model
        self.slots = slots or None
        #: Requests kept waiting in the upstream's own queue beyond its slots.
        self.queued = queued
        self.context_length = context_length or None
        self.capabilities = capabilities or frozenset()
        self._discover_capabilities = capabilities is None
        #: Chat requests go to /v1/chat/completions with their messages (the model's
        #: chat template); None: wherever the engine has one, found at :meth:`connect`.
        self.chat = bool(chat)
        self.identified_chat = chat is None
        self.on_down: Callable[[], None] | None = None
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # A stall is a read that waits longer than ``timeout``, however long the stream.
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=min(timeout, 5.0), sock_read=timeout
        )
        self._probe_timeout = aiohttp.ClientTimeout(total=min(timeout, 5.0))
        self._headers = headers
        self._client: aiohttp.ClientSession | None = None
        #: Streams open now, and the connection opened ahead of the next one
        #: (:meth:`_keep_warm`): its task, and whether it waits in the pool unused.
        self._streams = 0
        self._warming: asyncio.Task[None] | None = None
        self._warm = False

    def _http(self) -> aiohttp.ClientSession:
        """The pooled client, created in the running event loop (aiohttp's, not
        httpx's: it reads a stream at well under half the CPU per token, which the
        worker spends beside the engine)."""
        if self._client is None:
            connections = (self.slots or 64) + self.queued + SPARE_CONNECTIONS
            self._client = aiohttp.ClientSession(
                headers=self._headers,
                timeout=self._timeout,
                connector=aiohttp.TCPConnector(limit=connections),
            )
        return self._client

    async def _post(
        self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> aiohttp.ClientResponse:
        """POST ``body`` (with ``headers`` beside the session's); sent again on another
        connection where the pool's one was found closed (:mod:`llmq.stale_connections`).
        The caller releases the answer."""
        for _ in range(STALE_RETRIES):
            try:
                return await self._http().post(self.url + path, json=body, headers=headers)
            except aiohttp.ClientError as exc:
                if not unsent(exc):
                    raise
        return await self._http().post(self.url + path, json=body, headers=headers)

    async def _post_status(self, path: str, body: dict[str, Any]) -> int:
        async with await self._post(path, body) as response:
            await response.read()
            return response.status

    async def _get_json(self, path: str) -> Any:
        async with self._http().get(self.url + path) as response:
            response.raise_for_status()
            return await response.json(content_type=None)

    async def connect(self) -> None:
        """Learn what the settings left open; raises :class:`UpstreamDown` if it cannot."""
        try:
            if self.identified:
                self.engine = await identify(self._get_json) or ENGINES["generic"]
            found = await self.engine.discover(self._get_json)
            self.model = self.model or found.model or ""
            if self.identified_chat:
                renders = found.chat
                if renders is None:
                    renders = await self.engine.renders_chat(self._post_status, self.model)
                self.chat = renders is not False
        except (*HTTP_ERRORS, ValueError, KeyError) as exc:
            raise UpstreamDown(f"upstream {self.url} did not answer discovery: {exc}") from exc
        self.slots = self.slots or found.slots
        self.context_length = self.context_length or found.context_length
        if self._discover_capabilities:
            # tools travel only on the chat API
            self.capabilities = found.capabilities - (frozenset() if self.chat else {"tools"})
        if self._client is not None and found.slots:
            await self._client.close()  # sized by the slots, now known
            self._client = None
        self._keep_warm()

    @property
    def prefix_cache(self) -> bool:
        """Whether its engine keeps a prefix cache: routing a prompt to the upstream
        that holds its prefix pays (:func:`llmq.model.interface.prefix_cache_of`)."""
        return self.engine.name in PREFIX_CACHES

    def found(self) -> dict[str, Any]:
        """What the worker knows of the upstream, for ``/v1/workers``."""
        return {
            "engine": self.engine.name,
            "identified": self.identified,
            "slots": self.slots,
            "context_length": self.context_length,
            "tokenize": self.engine.tokenize_path,
            "chat": self.chat,
            # where the API renders a chat request as this engine will (routing)
            "render": self.engine.renderer(self.url, self.model) if self.chat else None,
        }

    async def probe(self) -> bool:
        """Whether the upstream answers its health check now. The answer is read whole,
        so that its connection stays kept alive in the pool (:meth:`_keep_warm`)."""
        url = self.url + self.engine.health_path
        try:
            async with self._http().get(url, timeout=self._probe_timeout) as response:
                await response.read()
                return response.status == 200
        except HTTP_ERRORS:
            return False

    def _keep_warm(self) -> None:
        """Open the next stream's connection now, while a slot is free, on an engine that
        closes each stream's (:attr:`~worker.backends.engines.Engine.closes_streams`).

        A new connection costs a request's first token a TCP handshake and aiohttp's
        setup of it; a health check (:meth:`probe`) opens one ahead, which stays kept
        alive in the pool, where the next stream finds it. One at a time, and only
        while fewer streams are open than the engine has slots: an idle connection
        holds one of llama.cpp's HTTP threads (by default at least two more than its
        slots) until it is used or the server's keep-alive ends it (then the next
        stream opens its own again).
        """
        if (
            not self.engine.closes_streams
            or self._warm
            or self._streams >= (self.slots or 1)
            or (self._warming is not None and not self._warming.done())
        ):
            return
        self._warming = asyncio.create_task(self._open_ahead())

    async def _open_ahead(self) -> None:
        # a failed check leaves none: the next stream connects itself, and meets the
        # failure if it lasts
        self._warm = await self.probe()

    async def aclose(self) -> None:
        if self._warming is not None:
            await stop_tasks([self._warming], 5.0)
        if self._client is not None:
            await self._client.close()
            self._client = None

    def count_tokens(self, text: str) -> int:
        return CHARS.count(text)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Output]:
        if request.max_tokens <= len(request.generated):
            return
        chat = self.chat and bool(request.messages)
        tools = chat and self._offers_tools(request)
        # What the upstream continues after: the published tokens, or nothing for a
        # request that offers tools (a half-written call cannot be continued: replayed)
        resumed = () if tools else request.generated
        prompt = request.prompt + "".join(resumed)
        remaining = request.max_tokens - len(resumed)
        counted = await self._count_if_long(prompt, remaining)
        if counted is not None:
            yield Report(prompt_tokens=max(1, counted - len(resumed)))
        path = "/v1/chat/completions" if chat else "/v1/completions"
        body = self._body(request, prompt, remaining, len(resumed))
        echoed = ""
        if chat:
            body = self._chat_body(request, body, resumed)
            if self.engine.echoes_prefill:
                echoed = "".join(resumed)
        self._streams += 1
        self._warm = False  # the stream takes the connection opened ahead, if any
        failed = False
        # While tracing, the call is a span of the run's trace, whose context the engine
        # gets in ``traceparent`` (vLLM's own spans join it).
        engine = tracing.start_engine(self.url + path, self.model)
        try:
            # Leaving the block before the end of the stream closes its connection:
            # the upstream aborts the sequence and frees its slot.
            async with await self._post(path, body, tracing.inject(engine)) as response:
                tracing.attribute(engine, "http.response.status_code", response.status)
                if response.status >= 400:
                    _raise_for(response.status, await response.read())
                outputs = self._outputs(response, len(resumed), echoed, request.seed, tools)
                if len(resumed) < len(request.generated):
                    outputs = _after_published(outputs, request.generated)
                try:
                    async for out in outputs:
                        yield out
                finally:
                    if self.engine.closes_streams:
                        # the server closes it after the stream, but a stream read to
                        # its end (or left once all of it arrived) would go back to the
                        # pool, where a health check could meet it
                        response.close()
        except HTTP_ERRORS as exc:
            failed = True
            self._down()
            raise UpstreamDown(f"upstream stream failed: {exc!r}") from exc
        except UpstreamDown:
            failed = True
            self._down()
            raise
        finally:
            self._streams -= 1
            if not failed:
                self._keep_warm()
            tracing.end(engine, failed)

    def _down(self) -> None:
        if self.on_down is not None:
            self.on_down()

    def _offers_tools(self, request: GenerationRequest) -> bool:
        """Whether the upstream gets ``request``'s tools, and may call one."""
        return "tools" in self.capabilities and bool(request.tools)

    def _body(
        self, request: GenerationRequest, prompt: str, remaining: int, resumed: int
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": remaining,
            "temperature": request.temperature,
            "seed": request.seed % 2**31,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.stop:
            body["stop"] = list(request.stop)
        if request.logprobs is not None:
            body["logprobs"] = max(1, request.logprobs)
        if request.response_format is not None:
            body["response_format"] = request.response_format
        if request.ignore_eos:
            body["ignore_eos"] = True
        if request.min_tokens > resumed:
            body["min_tokens"] = request.min_tokens - resumed
        self.engine.ask_token_counts(body)
        return body

    def _chat_body(
        self, request: GenerationRequest, body: dict[str, Any], resumed: tuple[str, ...]
    ) -> dict[str, Any]:
        """The chat API's body: the messages, and on a resume the text so far as the
        assistant's final message, which the upstream continues (vLLM's and llama.cpp's
        ``continue_final_message`` without a new generation prompt). An upstream that
        takes tools gets the request's tools and an agent's turns as they are; one
        that does not gets those turns as llmq's plain text."""
        del body["prompt"]
        if "tools" in self.capabilities:
            messages = list(request.messages)
        else:
            messages = [{"role": m["role"], "content": message_text(m)} for m in request.messages]
        if resumed:
            messages.append({"role": "assistant", "content": "".join(resumed)})
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
        body["messages"] = messages
        if request.logprobs is not None:
            body["logprobs"], body["top_logprobs"] = True, request.logprobs
        if self._offers_tools(request):
            body["tools"] = [{"type": "function", "function": _function(t)} for t in request.tools]
            body["tool_choice"] = request.tool_choice
            # llmq's stream carries one call per choice
            body["parallel_tool_calls"] = False
            # a second call ends the stream before the usage, whose count this gives
            self.engine.ask_counts_early(body)
        return body

    async def _outputs(
        self,
        response: aiohttp.ClientResponse,
        resumed: int,
        echoed: str = "",
        seed: int = 0,
        tools: bool = False,
    ) -> AsyncIterator[Output]:
        """Tokens and reports from the stream; ``echoed``: the continued message's text,
        which the upstream sends back first (dropped: it was published already);
        ``tools``: the request offered tools (its body asked for the counts early)."""
        finished = False
        call = _ToolCall(f"call_{seed:016x}")
        echo = _Echo(echoed)
        counted = not tools  # the counts come early only where the body asked for them
        generated = 0  # the engine's count of this stream's tokens, where it reports one
        # Every token of every stream passes here: the common case (a chunk of plain
        # text, nothing echoed or called) takes no helper calls.
        async for frame in frames(response.content.iter_any()):
            data = frame.data
            if not data.startswith("{") and data.strip() == DONE:
                break  # a [DONE] without a finish reason is a stream cut short
            chunk = from_json(data)
            if error := chunk.get("error"):
                # an error after the stream began: the request's fault where it says so
                status = error.get("code") if isinstance(error, dict) else None
                _raise_for(
                    status if isinstance(status, int) and status >= 400 else 500, data.encode()
                )
            if not counted and (early := self.engine.counted_early(chunk)) is not None:
                counted = True
                yield Report(prompt_tokens=max(1, early[0] - resumed), cached_tokens=early[1])
            tokens, generated = _chunk_tokens(self.engine, chunk, generated)
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                text = choice.get("text") or delta.get("content") or ""
                logprobs = choice.get("logprobs")
                reason = choice.get("finish_reason")
                tool_calls = delta.get("tool_calls")
                ids = choice.get("token_ids")
                count = len(ids) if ids is not None else tokens
                special = echo.left or tool_calls or call.started is not None
                # counts matter only where they are not one per text (vLLM merges, and
                # llama.cpp holds back a token that ends inside a character)
                if special or (count is not None and (count != 1 or not text)):
                    outs = (
                        _choice_outputs(echo, call, text, (logprobs, count), reason, tool_calls)
                        if special
                        else _per_token(text, logprobs, count or 0)
                    )
                    for out in outs:
                        yield out
                elif text:
                    yield text if logprobs is None else _token(text, logprobs)
                if reason or call.ended:
                    finished = True
                    yield Report(finish_reason=_finish_reason(reason or "stop"))
            if call.ended:
                return  # a second call: closing the stream ends the sequence
            usage = chunk.get("usage")
            if usage:
                yield _usage_report(usage, resumed)
        if not finished:
            raise UpstreamDown("the upstream's stream ended before its finish reason")

    async def _count_if_long(self, prompt: str, remaining: int) -> int | None:
        """The prompt's exact token count where it might not fit the context (None: it
        surely fits, or the engine cannot count); refuses one that does not fit.

        A token covers at least one UTF-8 byte, so a prompt of fewer bytes than the
        context leaves is counted by nobody but the upstream: no round trip on the
        way to the first token of an ordinary request.
        """
        limit = self.context_length
        path = self.engine.tokenize_path
        if limit is None or path is None or len(prompt.encode()) + 2 < limit:
            return None
        try:
            body = self.engine.tokenize_body(self.model, prompt)
            async with await self._post(path, body) as response:
                status, content = response.status, await response.read()
        except HTTP_ERRORS as exc:
            self._down()
            raise UpstreamDown(f"upstream tokenize failed: {exc!r}") from exc
        _raise_for(status, content)
        count = self.engine.token_count(json.loads(content))
        if count >= limit:
            raise Refused(
                f"the prompt has {count} tokens; the model's context length is {limit}",
                code="context_length_exceeded",
                param="prompt",
            )
        return count


def _chunk_tokens(engine: Engine, chunk: dict[str, Any], before: int) -> tuple[int | None, int]:
    """The tokens in ``chunk`` by the engine's running count of the stream's tokens
    (llama.cpp's ``timings.predicted_n``; None: it reports none), and the count now."""
    so_far = engine.generated(chunk)
    return (None, before) if so_far is None else (so_far - before, so_far)


def _per_token(text: str, logprobs: Any, count: int) -> list[str]:
    """A chunk's text as ``count`` outputs, ``count`` the token ids the engine listed
    for it (vLLM merges the tokens of several steps into one chunk when its reader
    falls behind, and sends a token that ends inside a character with no text): the
    text, with the first token's log-probability, then an empty text for each
    further token, so that llmq counts the engine's tokens (``max_tokens``, a resume's
    remaining ones, the usage) and the text stays whole."""
    if count == 0:
        return [text] if text else []
    return [_token(text, logprobs), *([""] * (count - 1))]


def _choice_outputs(
    echo: _Echo,
    call: _ToolCall,
    text: str,
    counted: tuple[Any, int | None],
    reason: Any,
    tool_calls: Any,
) -> list[Output]:
    """A choice's outputs while an echo may still come back or a tool is called;
    ``counted``: the chunk's log-probabilities and its tokens where the engine says
    (held with its text while the echo is undecided: a character of two tokens right
    after a resume still counts two)."""
    outs: list[Output] = []
    for piece, (piece_logprobs, tokens) in echo.feed(text, counted, last=bool(reason)):
        if call.started is None:  # text after a call has no place
            if tokens is None:
                outs.append(_token(piece, piece_logprobs))
            else:
                outs += _per_token(piece, piece_logprobs, tokens)
    logprobs = counted[0]
    for out in call.outputs(tool_calls or ()):
        outs.append(out if isinstance(out, ToolCallStart) else _token(out, logprobs))
    return outs


class _ToolCall:
    """The upstream's ``tool_calls`` deltas as llmq's outputs: the call's start (its
    ``id``, else ``fallback_id``, and name), then the pieces of its arguments. A
    second call (an engine that ignores ``parallel_tool_calls: false``) ends it."""

    def __init__(self, fallback_id: str) -> None:
        self.fallback_id = fallback_id
        #: The upstream's index of the call being relayed (None: none yet).
        self.started: int | None = None
        self.ended = False

    def outputs(self, deltas: Any) -> list[str | ToolCallStart]:
        outs: list[str | ToolCallStart] = []
        for delta in deltas:
            index = delta.get("index", 0)
            function = delta.get("function") or {}
            if self.started is None:
                name = function.get("name")
                if not name:
                    continue  # nothing to call yet
                self.started = index
                outs.append(ToolCallStart(str(delta.get("id") or self.fallback_id), str(name)))
            elif index != self.started:
                self.ended = True
                break
            arguments = function.get("arguments")
            if arguments:
                outs.append(arguments if isinstance(arguments, str) else json.dumps(arguments))
        return outs


async def _after_published(
    outputs: AsyncIterator[Output], published: tuple[str, ...]
) -> AsyncIterator[Output]:
    """A replay's outputs after the tokens already ``published`` (a re-run of a request
    that offers tools starts over), which it must repeat: a tool call's start among
    them was published with them; a token that differs raises :class:`ReplayDiverged`."""
    seen = 0
    async for out in outputs:
        if seen == len(published) or isinstance(out, Report):
            yield out
        elif isinstance(out, ToolCallStart):
            continue
        elif str(out) != published[seen]:
            raise ReplayDiverged(
                f"the replay's token {seen} is {str(out)!r}, not the published {published[seen]!r}"
            )
        else:
            seen += 1
    if seen < len(published):
        raise ReplayDiverged(f"the replay ended after {seen} of {len(published)} published tokens")


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool as the chat API defines a function: without parameters where it has none."""
    return {k: v for k, v in tool.items() if v is not None}


class _Echo:
    """The continued message's text, which some engines send back before the new
    tokens, and some do not (llama.cpp's builds differ): dropped when it comes, since
    it was published already. New output can start like the published text (a
    one-character token that equals its first), so chunks that match are held until
    the whole text has come back (an echo: dropped) or a chunk departs from it (no
    echo: the held chunks are output after all, in order)."""

    def __init__(self, text: str) -> None:
        #: The text still to come back; "" once it came or departed, and then
        #: nothing is held.
        self.left = text
        self.held: list[tuple[str, Any]] = []

    def feed(self, text: str, logprobs: Any, *, last: bool = False) -> list[tuple[str, Any]]:
        """What of this chunk (and those held) is output; ``last``: the stream ends
        with it, so nothing stays held."""
        if not self.left:
            return [(text, logprobs)] if text else []
        if not text:
            return self._release() if last else []
        cut = min(len(self.left), len(text))
        if text[:cut] != self.left[:cut]:
            return [*self._release(), (text, logprobs)]  # not an echo: a continuation
        self.left = self.left[cut:]
        if self.left:
            self.held.append((text, logprobs))
            return self._release() if last else []
        self.held = []  # the whole text came back: an echo
        return [(text[cut:], logprobs)] if text[cut:] else []

    def _release(self) -> list[tuple[str, Any]]:
        held, self.held, self.left = self.held, [], ""
        return held


def _token(text: str, logprobs: Any) -> str:
    """A chunk's text, with its log-probability when the upstream sent one: OpenAI's
    completions shape (``token_logprobs``, ``top_logprobs`` maps: vLLM) or its chat
    shape (``content``: ``logprob`` and ``top_logprobs`` lists: llama.cpp)."""
    if not isinstance(logprobs, dict):
        return text
    content = logprobs.get("content")
    if content:
        first = content[0]
        top = [(str(t["token"]), float(t["logprob"])) for t in first.get("top_logprobs") or ()]
        return Token(text, TokenLogprob(logprob=float(first["logprob"]), top=top))
    if not logprobs.get("token_logprobs"):
        return text
    value = logprobs["token_logprobs"][0]
    tops = (logprobs.get("top_logprobs") or [None])[0] or {}
    ranked = sorted(((t, float(lp)) for t, lp in tops.items()), key=lambda p: -p[1])
    return Token(text, TokenLogprob(logprob=float(value or 0.0), top=ranked))


def _finish_reason(reason: str) -> Literal["stop", "length"]:
    return "length" if reason == "length" else "stop"


def _usage_report(usage: dict[str, Any], resumed: int) -> Report:
    """The prompt's count as the upstream made it, less the resumed tokens it counted
    as prompt; the cached part where it says (vLLM's ``prompt_tokens_details``)."""
    prompt = usage.get("prompt_tokens")
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Report(
        prompt_tokens=max(1, int(prompt) - resumed) if prompt is not None else None,
        cached_tokens=int(cached) if cached is not None else None,
    )
