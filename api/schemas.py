"""Request bodies of the HTTP API, validated by pydantic.

They follow OpenAI's completions and chat completions (as vLLM serves them, with
its ``priority`` extension). Unknown fields are ignored, as OpenAI clients send
many optional ones; fields we cannot honour (``n`` > 1, a list of prompts) are
rejected with a clear message rather than silently changed.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# Ranges of pydantic (static) checks; limits that are settings are checked by the API.
PRIORITY_RANGE = 1_000_000


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False


class GenerationParams(_Body):
    """Fields common to every generation endpoint."""

    model: str = Field(min_length=1, max_length=256)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    n: Literal[1] = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    priority: int = Field(0, ge=-PRIORITY_RANGE, le=PRIORITY_RANGE)
    queue_timeout: float | None = Field(
        None, gt=0, description="Seconds the request may wait in the queue."
    )
    generation_timeout: float | None = Field(
        None, gt=0, description="Seconds the request may run once started."
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


class StreamingParams(GenerationParams):
    stream: bool = False
    stream_options: StreamOptions | None = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class CompletionRequest(StreamingParams):
    """``POST /v1/completions``."""

    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)]

    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatCompletionRequest(StreamingParams):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1, max_length=1024)
    max_completion_tokens: int | None = Field(None, ge=1)

    def prompt_text(self) -> str:
        """The messages rendered as one prompt: a plain ``role: content`` template."""
        lines = [f"{m.role}: {m.text()}" for m in self.messages]
        return "\n".join([*lines, "assistant:"])

    def content_tokens_present(self) -> bool:
        return any(m.text().strip() for m in self.messages)


class NativeRequest(GenerationParams):
    """``POST /v1/requests``: a prompt to run in the background, streamed on demand."""

    prompt: str
