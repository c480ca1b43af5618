"""What each inference server says beyond the OpenAI API, and where it says it.

Every engine streams ``/v1/completions``; they differ in how they report their
slots, context length and capabilities, whether they tokenize, and how they answer a
health check. Each :class:`Engine` names those endpoints and reads their answers; an
engine that lacks one leaves it to the settings (or to the documented
approximation). Checked against: vLLM (``/tokenize``, ``/v1/models``
``max_model_len`` and ``owned_by: "vllm"``, ``/version``, ``/health``,
``return_token_ids``; run in the tests as its CPU build), llama.cpp's
``llama-server`` (``/tokenize``, ``/props`` ``total_slots``,
``default_generation_settings.n_ctx`` and ``chat_template_caps``, ``/health``),
SGLang (``/server_info``, formerly ``/get_server_info``: its server arguments,
``max_running_requests`` and ``context_length`` among them, and ``version``), TGI
(``/info``: ``model_id``, ``max_total_tokens``) and Ollama (``/api/version``).

:func:`identify` tells which engine serves, from those endpoints, where the settings
do not name it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

#: GET of a path of the upstream, its JSON answer (raises on an error status).
GetJson = Callable[[str], Awaitable[Any]]
#: POST of a JSON body to a path of the upstream, the answer's status.
PostStatus = Callable[[str, dict[str, Any]], Awaitable[int]]


@dataclass(frozen=True)
class Discovered:
    """What the upstream told about itself (None: it did not say)."""

    model: str | None = None
    slots: int | None = None
    context_length: int | None = None
    #: Capabilities (:data:`~llmq.model.interface.CAPABILITIES`) the engine says it has.
    capabilities: frozenset[str] = frozenset()
    #: Whether it renders chat messages with a chat template (None: it does not say;
    #: its chat API is then assumed to).
    chat: bool | None = None


@dataclass(frozen=True)
class Engine:
    name: str
    #: Answers 200 when the server can generate.
    health_path: str = "/v1/models"
    #: POST path that counts a prompt's tokens; None: the engine has none.
    tokenize_path: str | None = None
    #: A continued chat message comes back with the continued text first (llama.cpp).
    echoes_prefill: bool = False
    #: The server closes its connection after every streamed answer, whatever its
    #: ``Keep-Alive`` header says (llama.cpp's): each stream needs a new connection.
    closes_streams: bool = False
    #: Asked to (``return_token_ids``), each chunk lists the ids of its tokens (vLLM's):
    #: a chunk of several tokens (vLLM merges them when its reader falls behind) or of
    #: none with text (a token that ends inside a character) still counts exactly.
    lists_token_ids: bool = False

    def ask_token_counts(self, body: dict[str, Any]) -> None:
        """Ask, in a request's ``body``, for the tokens each chunk of the stream carries
        (:meth:`generated`, or the ids vLLM lists). Engines that cannot: nothing."""
        if self.lists_token_ids:
            body["return_token_ids"] = True

    def generated(self, chunk: dict[str, Any]) -> int | None:
        """The tokens generated so far in this stream, as ``chunk`` reports them where
        :meth:`ask_token_counts` asked (None: it does not say)."""
        return None

    def ask_counts_early(self, body: dict[str, Any]) -> None:
        """Ask, in a request's ``body``, for the prompt's token count in the first chunk
        of the stream, not only in its usage after the last (which a stream the worker
        closes itself never gets). Engines that cannot: nothing to ask."""

    def counted_early(self, chunk: dict[str, Any]) -> tuple[int, int] | None:
        """The prompt's token count and how many of them were cached, where ``chunk``
        carries them as :meth:`ask_counts_early` asked; None where it does not."""
        return None

    async def discover(self, get: GetJson) -> Discovered:
        """The served model's name and context length from ``/v1/models``."""
        models = (await get("/v1/models")).get("data") or []
        first: dict[str, Any] = models[0] if models else {}
        length = first.get("max_model_len")  # vLLM, SGLang
        return Discovered(
            model=first.get("id"), context_length=int(length) if length else None, slots=None
        )

    async def renders_chat(self, post: PostStatus, model: str) -> bool | None:
        """Whether the engine has a chat template to apply (None: it cannot say)."""
        return None

    def tokenize_body(self, model: str, text: str) -> dict[str, Any]:
        return {"model": model, "prompt": text, "add_special_tokens": True}

    def renderer(self, url: str, model: str) -> dict[str, Any] | None:
        """Where and how the engine renders chat messages with the model's template, for
        routing's block names (``upstream.render`` in the registry): the ``url`` to POST
        ``{"messages", **fields}`` to, and whether its ``answer`` is the ``prompt`` text
        or its ``tokens``. None: the engine does not render."""
        return None

    def token_count(self, answer: dict[str, Any]) -> int:
        count = answer.get("count")
        return int(count) if count is not None else len(answer["tokens"])


@dataclass(frozen=True)
class LlamaCpp(Engine):
    """llama.cpp's ``llama-server``: ``/props`` has the slots, each slot's context, and
    what the chat template takes: a template that renders tools and tool calls
    (``chat_template_caps``) makes ``tools`` a capability (the server parses the
    model's calls with it, and constrains them for ``tool_choice`` "required")."""

    async def discover(self, get: GetJson) -> Discovered:
        found = await super().discover(get)
        props = await get("/props")
        settings = props.get("default_generation_settings") or {}
        n_ctx = settings.get("n_ctx") or props.get("n_ctx")
        caps = props.get("chat_template_caps") or {}
        tools = bool(caps.get("supports_tools") and caps.get("supports_tool_calls"))
        return Discovered(
            model=found.model,
            slots=int(props["total_slots"]) if props.get("total_slots") else None,
            context_length=int(n_ctx) if n_ctx else found.context_length,
            capabilities=frozenset({"tools"}) if tools else frozenset(),
            # the model's template, else the server's ChatML
            chat=bool(props.get("chat_template")),
        )

    def tokenize_body(self, model: str, text: str) -> dict[str, Any]:
        return {"content": text, "add_special": True}

    def renderer(self, url: str, model: str) -> dict[str, Any] | None:
        return {"url": f"{url}/apply-template", "answer": "prompt", "fields": {}}

    def ask_counts_early(self, body: dict[str, Any]) -> None:
        body["timings_per_token"] = True  # every chunk then carries ``timings``

    def ask_token_counts(self, body: dict[str, Any]) -> None:
        # a chunk that completes a character held back carries several tokens:
        # ``timings.predicted_n`` counts them
        body["timings_per_token"] = True

    def generated(self, chunk: dict[str, Any]) -> int | None:
        timings = chunk.get("timings")
        if not isinstance(timings, dict) or timings.get("predicted_n") is None:
            return None
        return int(timings["predicted_n"])

    def counted_early(self, chunk: dict[str, Any]) -> tuple[int, int] | None:
        timings = chunk.get("timings")
        if not isinstance(timings, dict) or timings.get("prompt_n") is None:
            return None
        cached = int(timings.get("cache_n") or 0)  # prompt_n counts only those computed
        return int(timings["prompt_n"]) + cached, cached


@dataclass(frozen=True)
class VLLM(Engine):
    """vLLM: its ``/tokenize`` takes chat messages too, and refuses them (400) where the
    model has no chat template, as its chat API then does."""

    async def renders_chat(self, post: PostStatus, model: str) -> bool | None:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
        status = await post("/tokenize", body)
        return status < 400 if status < 500 else None

    def renderer(self, url: str, model: str) -> dict[str, Any] | None:
        fields = {"model": model, "add_generation_prompt": True}
        return {"url": f"{url}/tokenize", "answer": "tokens", "fields": fields}


@dataclass(frozen=True)
class SGLang(Engine):
    """SGLang: ``/server_info`` holds its server arguments, among them the most
    requests it runs at once (``max_running_requests``, where set) and the context
    length (``context_length``, where set; ``/v1/models`` has the model's)."""

    async def discover(self, get: GetJson) -> Discovered:
        found = await super().discover(get)
        info = await _sglang_info(get) or {}
        running, length = info.get("max_running_requests"), info.get("context_length")
        return Discovered(
            model=found.model,
            slots=int(running) if isinstance(running, int) and running > 0 else None,
            context_length=found.context_length or (int(length) if length else None),
        )


@dataclass(frozen=True)
class TGI(Engine):
    """Hugging Face's text-generation-inference: ``/info`` has the longest prompt plus
    output (``max_total_tokens``); its ``max_concurrent_requests`` bounds its queue,
    not the sequences it runs, so the slots stay the settings'."""

    async def discover(self, get: GetJson) -> Discovered:
        found = await super().discover(get)
        total = (await get("/info")).get("max_total_tokens")
        return Discovered(model=found.model, context_length=int(total) if total else None)


ENGINES: dict[str, Engine] = {
    "generic": Engine("generic"),
    "vllm": VLLM("vllm", health_path="/health", tokenize_path="/tokenize", lists_token_ids=True),
    "sglang": SGLang("sglang", health_path="/health"),
    "tgi": TGI("tgi", health_path="/health"),
    "ollama": Engine("ollama"),
    "llamacpp": LlamaCpp(
        "llamacpp",
        health_path="/health",
        tokenize_path="/tokenize",
        echoes_prefill=True,
        closes_streams=True,
    ),
}


async def _answer(get: GetJson, path: str) -> dict[str, Any] | None:
    """``path``'s JSON object, None where the engine does not serve it (a 4xx, or an
    answer that is not JSON). A 5xx or a refused connection raises: the engine is not
    up yet (llama.cpp answers 503 while it loads), and the caller asks again later."""
    try:
        answer = await get(path)
    except aiohttp.ClientResponseError as exc:
        if exc.status >= 500:
            raise
        return None
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None


async def _sglang_info(get: GetJson) -> dict[str, Any] | None:
    for path in ("/server_info", "/get_server_info"):
        info = await _answer(get, path)
        if info is not None and "model_path" in info:
            return info
    return None


async def identify(get: GetJson) -> Engine | None:
    """The engine that serves, from what only it answers; None: none of those known.

    In order: llama.cpp's ``/props`` (``total_slots``), vLLM's ``/v1/models``
    (``owned_by: "vllm"``, confirmed by its ``/version``), SGLang's ``/server_info``
    (its ``model_path``), TGI's ``/info`` (``model_id``, ``max_total_tokens``),
    Ollama's ``/api/version``.
    """
    props = await _answer(get, "/props")
    if props is not None and "total_slots" in props:
        return ENGINES["llamacpp"]
    models = (await _answer(get, "/v1/models") or {}).get("data") or [{}]
    owner = models[0].get("owned_by") if isinstance(models[0], dict) else None
    if owner == "vllm" and await _answer(get, "/version") is not None:
        return ENGINES["vllm"]
    if await _sglang_info(get) is not None:
        return ENGINES["sglang"]
    info = await _answer(get, "/info")
    if info is not None and "model_id" in info and "max_total_tokens" in info:
        return ENGINES["tgi"]
    version = await _answer(get, "/api/version")
    if version is not None and "version" in version:
        return ENGINES["ollama"]
    return None
