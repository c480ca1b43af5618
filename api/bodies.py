"""Request bodies of the HTTP API, validated by pydantic in strict mode.

They follow OpenAI's completions and chat completions (as vLLM serves them, with
its ``priority``, ``ignore_eos`` and ``min_tokens`` extensions). Types are checked
strictly, as OpenAI does: ``"max_tokens": true`` or ``"stream": "yes"`` is a 400,
not a 1 or a true; an integer is a valid number. Every optional field accepts
``null`` (the default), as the OpenAI spec allows. Unknown fields are ignored, as
OpenAI clients send many optional ones (penalties, ``logit_bias``...). Fields the
serving model cannot honour are refused by the API (``unsupported_parameter``),
never silently dropped; limits that are settings are checked in :mod:`api.admission.submit`
so that their messages quote the configured values.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from llmq.model.interface import message_text

#: Error ``type`` of a validator that refuses what the API understands but cannot
#: serve; the error handler turns it into the code ``unsupported_parameter``.
UNSUPPORTED = "unsupported_parameter"


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class StreamOptions(_Body):
    include_usage: bool | None = None


class GenerationParams(_Body):
    """Fields common to every generation endpoint."""

    model: str = Field(min_length=1, max_length=256)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int | None = Field(None, ge=1, description="Choices per prompt (limit: LLMQ_MAX_CHOICES).")
    stop: str | list[str] | None = None
    seed: int | None = None
    priority: int | None = Field(None, description="Lower runs earlier; default 0.")
    queue_timeout: float | None = Field(
        None, gt=0, description="Seconds the request may wait in the queue."
    )
    generation_timeout: float | None = Field(
        None, gt=0, description="Seconds the request may run once started."
    )
    ignore_eos: bool | None = Field(
        None, description="Generate until max_tokens: the model never stops by itself."
    )
    min_tokens: int | None = Field(
        None, ge=0, description="Tokens generated before the model may stop by itself."
    )
    user: str | None = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > 4:
            raise ValueError("at most 4 stop sequences")
        return v

    def stop_sequences(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        items = [self.stop] if isinstance(self.stop, str) else self.stop
        return tuple(s for s in items if s)

    @property
    def choices(self) -> int:
        return self.n or 1


class StreamingParams(GenerationParams):
    stream: bool | None = None
    stream_options: StreamOptions | None = None

    @property
    def streaming(self) -> bool:
        return bool(self.stream)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class JsonSchemaFormat(_Body):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class CompletionRequest(StreamingParams):
    """``POST /v1/completions``: one prompt or a list of them (one choice each, times n)."""

    prompt: str | Annotated[list[str], Field(min_length=1)]
    logprobs: int | None = Field(None, ge=0, le=5, description="Top alternatives per token.")
    echo: bool | None = None
    best_of: int | None = Field(None, ge=1)
    suffix: str | None = None
    response_format: ResponseFormat | None = None

    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)


class TextPart(_Body):
    type: Literal["text"]
    text: str


def _text_only(value: Any) -> Any:
    """Name the problem for a non-text part (an image...), instead of a type error."""
    if isinstance(value, list):
        for part in value:
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str) and kind != "text":
                raise PydanticCustomError(
                    UNSUPPORTED,
                    "this model accepts text only; content parts of type '{kind}' are not "
                    "supported",
                    {"kind": kind},
                )
    return value


class FunctionCall(_Body):
    name: str
    arguments: str


class ToolCall(_Body):
    """A tool call in an assistant message of the history (an agent's earlier turn)."""

    id: str
    type: Literal["function"]
    function: FunctionCall


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    _parts = field_validator("content", mode="before")(_text_only)

    def text(self) -> str:
        return message_text(self.message())

    def message(self) -> dict[str, Any]:
        """The message as a backend with its own chat template takes it: its text, and
        an agent's turn (``tool_calls``, ``tool_call_id``) as the chat API has it."""
        if self.content is None:
            text = ""
        elif isinstance(self.content, str):
            text = self.content
        else:
            text = "".join(p.text for p in self.content)
        message: dict[str, Any] = {"role": self.role, "content": text}
        if self.tool_calls:
            message["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


class FunctionDefinition(_Body):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Body):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class ChatCompletionRequest(StreamingParams):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1, max_length=1024)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[Tool] | None = Field(None, max_length=128)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)

    def prompt_text(self) -> str:
        """The messages rendered as one prompt: a plain ``role: content`` template."""
        lines = [f"{m.role}: {m.text()}" for m in self.messages]
        return "\n".join([*lines, "assistant:"])

    def message_dicts(self) -> tuple[dict[str, Any], ...]:
        """The messages as a backend with its own chat template takes them."""
        return tuple(m.message() for m in self.messages)

    def content_tokens_present(self) -> bool:
        return any(m.text().strip() for m in self.messages)


class NativeRequest(GenerationParams):
    """``POST /v1/requests``: a prompt to run in the background, streamed on demand."""

    prompt: str


class EmbeddingRequest(_Body):
    """``POST /v1/embeddings``: one text or a list of them (token id lists are read as
    texts of their ids); ``seed``, ``priority`` and ``queue_timeout`` are llmq's."""

    model: str = Field(min_length=1, max_length=256)
    input: (
        str
        | Annotated[list[str], Field(min_length=1)]
        | Annotated[list[int], Field(min_length=1)]
        | Annotated[list[Annotated[list[int], Field(min_length=1)]], Field(min_length=1)]
    )
    dimensions: int | None = Field(None, ge=1)
    encoding_format: Literal["float", "base64"] | None = None
    user: str | None = None
    seed: int | None = None
    priority: int | None = Field(None, description="Lower runs earlier; default 0.")
    queue_timeout: float | None = Field(
        None, gt=0, description="Seconds the request may wait in the queue."
    )

    @field_validator("input", mode="before")
    @classmethod
    def _not_empty(cls, value: Any) -> Any:
        # before the union: each of its branches would refuse [] in its own words
        if isinstance(value, list) and not value:
            raise PydanticCustomError("too_short", "must hold at least one text")
        return value

    def texts(self) -> list[str]:
        if isinstance(self.input, str):
            return [self.input]
        texts = []
        for item in self.input:
            if isinstance(item, int):  # one input of token ids
                return [" ".join(map(str, self.input))]
            texts.append(item if isinstance(item, str) else " ".join(map(str, item)))
        return texts
