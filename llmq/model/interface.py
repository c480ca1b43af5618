"""The model's declaration: what every backend implements and what the API relies on.

A backend implements :class:`Backend`: count a prompt's tokens, and turn a
:class:`GenerationRequest` into an async iterator of outputs (:data:`Output`): token
texts (a :class:`Token` carries a log-probability), a :class:`ToolCallStart` before
the arguments of a tool call, a :class:`Report` of what the backend counted. The
iterator ending before ``max_tokens`` means the model stopped by itself
(finish_reason ``stop``); reaching ``max_tokens`` means ``length``. Everything
around it (queueing, streaming, cancellation) is the pipeline's job, not the model's.

A backend that runs its own step loop (continuous batching: every running sequence
advances one token per step) may also implement :class:`SteppedBackend`: it calls
back with each token from that loop instead of waking one iterator per token per
request, and the worker then takes the callbacks (see ``worker.runner``). The
iterator stays the interface every backend has.

A backend declares what it honours beyond plain text in a ``capabilities``
attribute (names from :data:`CAPABILITIES`); the API refuses requests that need
more than the serving workers declare, so nothing is silently ignored.

A re-run (after a worker died, or the model raised) passes the tokens the request
already published as :attr:`GenerationRequest.generated`: the backend continues
after them, as a server resuming a sequence would (prefill prompt + generated,
then decode the rest), instead of generating them again.

This module sits in the shared contract because the API sizes and checks requests
against the same declaration the workers implement; the implementations (the mock,
the adapters to inference servers) are the worker's.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from llmq.schema import TokenLogprob


def seed_for(request_id: str, seed: int | None) -> int:
    """The request's own seed, else one derived from its id, so a re-run repeats itself."""
    if seed is not None:
        return seed
    return int.from_bytes(hashlib.blake2b(request_id.encode(), digest_size=8).digest(), "big")


#: What a backend may declare it honours: log-probabilities, JSON mode, JSON
#: schemas, tool calls, the ``ignore_eos``/``min_tokens`` length controls, and
#: embeddings (the worker then has an :class:`Embedder`).
CAPABILITIES = frozenset(
    {"logprobs", "json_object", "json_schema", "tools", "ignore_eos", "min_tokens", "embeddings"}
)


def capabilities_of(model: object) -> tuple[str, ...]:
    """What ``model`` declares it honours (nothing if it declares nothing)."""
    declared: frozenset[str] = getattr(model, "capabilities", frozenset())
    return tuple(sorted(c for c in declared if c in CAPABILITIES))


def tokenizer_of(model: object) -> str:
    """The tokenizer ``model`` declares (:data:`llmq.model.tokenizer.TOKENIZERS`): the
    API counts and cuts prompts with it. The mock's whitespace words by default."""
    return str(getattr(model, "tokenizer", "whitespace"))


def prefix_cache_of(model: object) -> bool:
    """Whether ``model`` keeps a prefix cache (a prompt whose leading blocks it computed
    before prefills only the rest), so that routing a prompt to it pays; a model that
    does not say keeps none."""
    return bool(getattr(model, "prefix_cache", False))


def context_length_of(model: object) -> int | None:
    """The longest prompt + output ``model`` takes, in its tokens (None: it does not say)."""
    length = getattr(model, "context_length", None)
    return int(length) if length else None


class Refused(Exception):
    """The backend refuses the request itself (its input, not the backend, is at fault:
    an inference server's 4xx). The request ends with this error; a re-run would fail
    alike, so it is not retried. ``code`` and ``param`` as in OpenAI's error shape."""

    def __init__(self, message: str, *, code: str = "invalid_request", param: str | None = None):
        super().__init__(message)
        self.message, self.code, self.param = message, code, param


class Token(str):
    """A generated token that carries its log-probability (when the request asked).

    A ``str``, so that a consumer of plain token texts reads it unchanged.
    """

    logprob: TokenLogprob | None

    def __new__(cls, text: str, logprob: TokenLogprob | None = None) -> Token:
        token = super().__new__(cls, text)
        token.logprob = logprob
        return token


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    """The model calls a tool: the tokens that follow are its JSON arguments.

    Not a token (it adds no text): output once, before the arguments.
    """

    id: str
    name: str


@dataclass(frozen=True, slots=True)
class Report:
    """What the backend learned about the request, for its usage and finish reason.

    Not a token (it adds no text): output (or emitted) at any point, any number of
    times; later fields override earlier ones, ``None`` leaves a field as it was.
    A backend that counts tokens itself (an inference server) reports the prompt's
    true token count, how many of them came from its prefix cache, and why it stopped;
    without a report the worker counts the prompt as admitted and derives the finish
    reason from ``max_tokens``.
    """

    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: Literal["stop", "length"] | None = None


#: One output of a generation: a token (a ``str``: a :class:`Token` where it carries
#: a log-probability), a tool call's start, or a report. Told apart with
#: ``isinstance`` (a token is the only ``str``) or ``match``.
Output = str | ToolCallStart | Report


@dataclass(frozen=True)
class GenerationRequest:
    """What a model needs to generate: the prompt and the sampling parameters.

    ``generated`` holds the tokens this request already produced (and its readers
    already have), in order; empty on a first run. ``max_tokens`` counts them too:
    a model resuming after ``len(generated)`` tokens yields at most
    ``max_tokens - len(generated)`` more.
    """

    prompt: str
    max_tokens: int
    seed: int
    prompt_tokens: int
    stop: tuple[str, ...] = field(default=())
    temperature: float = 1.0
    generated: tuple[str, ...] = field(default=())
    #: Never stop by itself (stop sequences still apply), as vLLM's ``ignore_eos``.
    ignore_eos: bool = False
    #: Do not stop by itself before this many tokens (stop sequences still apply).
    min_tokens: int = 0
    #: Log-probabilities with this many alternatives per token; None: none.
    logprobs: int | None = None
    #: ``{"type": "json_object"}`` or ``{"type": "json_schema", "schema": ...}``.
    response_format: dict[str, Any] | None = None
    #: Function tools (``{"name", "parameters"}``, ``description`` where given) and
    #: whether to call one.
    tools: tuple[dict[str, Any], ...] = field(default=())
    tool_choice: Literal["auto", "required", "none"] = "auto"
    #: The chat's last message is a tool's result: with ``tool_choice`` "auto" a model
    #: mostly answers it in text, which is what ends an agent's loop.
    after_tool_result: bool = False
    #: A chat request's messages (``role``, ``content``; an agent's earlier turns with
    #: ``tool_calls`` and ``tool_call_id`` as the chat API has them); empty for a
    #: completion. A backend with its own chat template (an inference server's chat
    #: API) uses them instead of ``prompt``, their plain rendering.
    messages: tuple[dict[str, Any], ...] = field(default=())


def message_text(message: Mapping[str, Any]) -> str:
    """A chat message's text as llmq's plain rendering writes it: the tool calls of an
    assistant's turn follow its text as ``name(arguments)``, for a model that takes
    no tools."""
    text = str(message.get("content") or "")
    calls = [
        f"{call['function']['name']}({call['function']['arguments']})"
        for call in message.get("tool_calls") or ()
    ]
    return " ".join([text, *calls]) if calls else text


class Backend(Protocol):
    """A generator of tokens. Implementations must be safe to call concurrently.

    ``generate`` yields the tokens that follow ``request.generated``, not those
    tokens again: a real backend prefills ``prompt + generated`` (the KV cache of
    the interrupted run is gone) and decodes from there, and it stops by itself
    (or at ``max_tokens``, which counts the ``generated`` tokens) exactly as the
    uninterrupted run would have. A deterministic backend should make the resumed
    output equal to the rest of an uninterrupted run with the same seed.
    """

    def count_tokens(self, text: str) -> int: ...

    def generate(self, request: GenerationRequest) -> AsyncIterator[Output]: ...


#: Takes one output of a generation (:data:`Output`).
Emit = Callable[[Output], None]


@runtime_checkable
class SteppedBackend(Backend, Protocol):
    """A backend with its own step loop, which can hand tokens over by callback.

    ``generate_into`` produces what ``generate`` would yield, in the same order,
    calling ``emit`` with each from the backend's loop (synchronously, on the
    running event loop) and returning when the generation ends; cancelling it stops
    the sequence. ``emit`` must not block; if it raises, the generation ends with
    that exception. One wake-up per step for every sequence instead of one per
    token per sequence is what makes this cheaper than iterating.
    """

    async def generate_into(self, request: GenerationRequest, emit: Emit) -> None: ...


#: Called with the block names (:func:`llmq.model.blocks.block_hashes`) that became
#: cached and those that were evicted, in that order, whenever the cache changes.
CacheListener = Callable[[Sequence[str], Sequence[str]], None]


@runtime_checkable
class CacheReporting(Protocol):
    """A backend that knows (or estimates) which prompt blocks its KV cache holds.

        The worker publishes what the listener hears, so that the queue can send a
        request to the worker that already holds its prefix. The mock's engine reports
        exactly; an adapter to an inference server may estimate from what it sent. Such a
        backend reports a prefix hit with a :class:`Report` (``cached_tokens``) before the
        first token (the usage then carries ``prompt_tokens_details``); a miss may go
    unreported (the worker counts it as a lookup that found nothing), so that consumers
    that take every output for a token see none for the prompts the cache lacks.
    """

    def watch_cache(self, listener: CacheListener) -> None: ...


@runtime_checkable
class Embedder(Protocol):
    """A backend that turns texts into vectors (``POST /v1/embeddings``).

    ``embed`` returns one vector per text, in order, each of ``dimensions``
    components (None: the backend's own number); the same texts, dimensions and
    ``seed`` give the same vectors. A backend that has no notion of a seed ignores it.
    """

    async def embed(
        self, texts: Sequence[str], dimensions: int | None, seed: int
    ) -> list[list[float]]: ...


@runtime_checkable
class KVCacheUsage(Protocol):
    """A backend that knows how full its KV cache is (vLLM's ``kv_cache_usage_perc``):
    the worker's heartbeat carries it to ``/metrics``."""

    def kv_usage(self) -> float:
        """The fraction of the KV cache that running sequences hold, 0 to 1."""
        ...
