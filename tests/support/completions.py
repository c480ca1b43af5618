"""The openai SDK against an inference server or llmq: the upstream tests' client."""

from __future__ import annotations

from typing import Any

import openai

from tests.support.llama import MODEL


def sdk(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


async def streamed(
    client: openai.AsyncOpenAI, prompt: str, max_tokens: int, **more: Any
) -> tuple[str, str | None, Any]:
    """Text, finish reason and usage of one streamed completion at temperature 0."""
    stream = await client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        **more,
    )
    text, finish, usage = "", None, None
    async for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            text += choice.text or ""
            finish = choice.finish_reason or finish
    return text, finish, usage


async def direct(url: str, prompt: str, max_tokens: int) -> str:
    """The text the server at ``url`` itself streams for ``prompt`` at temperature 0."""
    async with sdk(url) as client:
        text, _, _ = await streamed(client, prompt, max_tokens)
    return text


async def chat_text(client: openai.AsyncOpenAI, messages: list[Any], max_tokens: int) -> str:
    """The text of one streamed chat completion at temperature 0."""
    stream = await client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0, stream=True
    )
    return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
