"""What a request asks of the model beyond plain text: structured output, tools,
log-probabilities, length controls.

Each is validated here and passed through to the model interface; each needs a
capability that the serving workers declare
(:meth:`~llmq.schema.SamplingParams.required_capabilities`), and a request that
needs one they lack is refused with 400 ``unsupported_parameter``, never served
as if the field were absent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from api.bodies import ChatCompletionRequest, CompletionRequest, ResponseFormat, Tool
from api.errors import InvalidRequest, Unsupported
from llmq.model.json_subset import unsupported

ToolChoice = Literal["auto", "required", "none"]


@dataclass(frozen=True)
class Extras:
    """The non-text asks of one request, in the shape :class:`~llmq.schema.SamplingParams` takes."""

    logprobs: int | None = None
    response_format: dict[str, Any] | None = None
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: ToolChoice = "auto"
    after_tool_result: bool = False


def completion_extras(body: CompletionRequest) -> Extras:
    # Options that would change the answer and that llmq does not implement.
    if body.echo:
        raise Unsupported("echo is not supported", param="echo")
    if body.best_of is not None and body.best_of != body.choices:
        raise Unsupported("best_of other than n is not supported", param="best_of")
    if body.suffix:
        raise Unsupported("suffix is not supported", param="suffix")
    return Extras(logprobs=body.logprobs, response_format=_response_format(body.response_format))


def chat_extras(body: ChatCompletionRequest) -> Extras:
    if body.top_logprobs and not body.logprobs:
        raise InvalidRequest(
            "top_logprobs requires logprobs: true", param="top_logprobs", code="invalid_value"
        )
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    tools, choice = _tools(body)
    return Extras(
        logprobs=logprobs,
        response_format=_response_format(body.response_format),
        tools=tools,
        tool_choice=choice,
        after_tool_result=body.messages[-1].role == "tool",
    )


def _response_format(fmt: ResponseFormat | None) -> dict[str, Any] | None:
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if fmt.json_schema is None:
        raise InvalidRequest(
            "response_format of type json_schema needs a json_schema",
            param="response_format.json_schema",
            code="invalid_value",
        )
    schema = fmt.json_schema.schema_
    if schema is not None and (why := unsupported(schema)) is not None:
        raise Unsupported(
            f"response_format.json_schema: {why}", param="response_format.json_schema.schema"
        )
    return {"type": "json_schema", "schema": schema}


def _tool(tool: Tool) -> dict[str, Any]:
    """A tool as the model takes it: its name and parameters, and its description for
    a model that reads it (an upstream's chat template)."""
    defined = {"name": tool.function.name, "parameters": tool.function.parameters}
    if tool.function.description:
        defined["description"] = tool.function.description
    return defined


def _tools(body: ChatCompletionRequest) -> tuple[tuple[dict[str, Any], ...], ToolChoice]:
    tools = body.tools or []
    choice = body.tool_choice
    for i, tool in enumerate(tools):
        params = tool.function.parameters
        if params is not None and (why := unsupported(params, "parameters")) is not None:
            raise Unsupported(f"tools[{i}].function.{why}", param=f"tools[{i}].function.parameters")
    defined = [_tool(t) for t in tools]
    if choice is None or choice == "auto" or choice == "none":
        return tuple(defined), choice or "auto"
    if not defined:
        raise InvalidRequest(
            "tool_choice requires tools", param="tool_choice", code="invalid_value"
        )
    if choice == "required":
        return tuple(defined), "required"
    named = [t for t in defined if t["name"] == choice.function.name]
    if not named:
        raise InvalidRequest(
            f"tool_choice names the function '{choice.function.name}', which is not in tools",
            param="tool_choice",
            code="invalid_value",
        )
    return (named[0],), "required"
