"""The body of ``POST /v1/responses`` and its translation into the chat request the queue runs.

The Responses API is served on the chat path: ``instructions`` become a system
message, ``input`` (a string, or a list of message, ``function_call`` and
``function_call_output`` items) become chat messages after the stored
conversation of ``previous_response_id``, flat function tools become chat tools,
``text.format`` becomes ``response_format`` and ``max_output_tokens`` the token
limit. Anything the chat path cannot honour (built-in tools, images, files,
``background``) is refused with ``unsupported_parameter``, never dropped.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError

from api.bodies import ChatCompletionRequest, GenerationParams, _Body
from api.errors import InvalidRequest, Unsupported

#: Content part types of a message item that carry text.
TEXT_PARTS = frozenset({"input_text", "output_text", "text", "refusal"})


class ContentPart(_Body):
    type: str
    text: str | None = None
    refusal: str | None = None


class MessageItem(_Body):
    type: Literal["message"] | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]
    id: str | None = None
    status: str | None = None

    def text(self, where: str) -> str:
        if isinstance(self.content, str):
            return self.content
        texts = []
        for i, part in enumerate(self.content):
            if part.type not in TEXT_PARTS:
                raise Unsupported(
                    f"this model accepts text only; content parts of type '{part.type}' are "
                    "not supported",
                    param=f"{where}.content[{i}]",
                )
            texts.append(part.text if part.text is not None else part.refusal or "")
        return "".join(texts)


class FunctionCallItem(_Body):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(_Body):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[ContentPart]
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        if isinstance(self.output, str):
            return self.output
        return "".join(p.text or "" for p in self.output)


#: The item types served, and what each needs (for the message of a malformed one).
KNOWN_ITEMS = {
    "message": "it needs a role (user, assistant, system, developer) and a content",
    "function_call": "it needs a call_id, a name and arguments (a string)",
    "function_call_output": "it needs a call_id and an output",
}


class OtherItem(_Body):
    """An item type the chat path has no equivalent for (refused by name)."""

    type: str


InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem | OtherItem


class FunctionTool(_Body):
    """A function tool, flat as the Responses API defines it (other tool types are
    refused when the request is translated)."""

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class TextFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(_Body):
    format: TextFormat | None = None
    verbosity: str | None = None


class NamedFunctionChoice(_Body):
    type: Literal["function"]
    name: str


class ResponsesRequest(GenerationParams):
    """``POST /v1/responses``; the generation fields (priority, timeouts, seed...) are
    those of every generation endpoint."""

    input: str | Annotated[list[InputItem], Field(min_length=1, max_length=1024)]
    instructions: str | None = None
    previous_response_id: str | None = Field(None, max_length=128)
    max_output_tokens: int | None = Field(None, ge=1)
    tools: list[FunctionTool] | None = Field(None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    store: bool | None = None
    stream: bool | None = None
    metadata: dict[str, str] | None = None
    background: bool | None = None
    truncation: Literal["auto", "disabled"] | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)

    @property
    def storing(self) -> bool:
        return self.store is not False

    def refuse_unsupported(self) -> None:
        """Refuse what is understood but not served (refused, never ignored)."""
        if self.background:
            raise Unsupported("background responses are not supported", param="background")
        if self.top_logprobs:
            raise Unsupported("top_logprobs is not supported here", param="top_logprobs")
        if self.n is not None and self.n != 1:
            raise Unsupported("the Responses API has one output; n must be 1", param="n")


def input_messages(body: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's ``input`` as chat messages (dicts in the chat request's shape)."""
    if isinstance(body.input, str):
        return [{"role": "user", "content": body.input}]
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(body.input):
        where = f"input[{i}]"
        if isinstance(item, MessageItem):
            messages.append({"role": item.role, "content": item.text(where)})
        elif isinstance(item, FunctionCallItem):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls"):
                last["tool_calls"].append(call)  # parallel calls of one turn
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text()})
        elif item.type == "reasoning":
            continue  # another model's reasoning summary: no text this model reads
        elif item.type in KNOWN_ITEMS:
            raise InvalidRequest(
                f"{where} is not a valid {item.type} item: {KNOWN_ITEMS[item.type]}",
                param=where,
                code="invalid_value",
            )
        else:
            raise Unsupported(f"input items of type '{item.type}' are not supported", param=where)
    return messages


def _chat_tools(body: ResponsesRequest) -> list[dict[str, Any]] | None:
    if body.tools is None:
        return None
    tools = []
    for i, tool in enumerate(body.tools):
        if tool.type != "function":
            raise Unsupported(
                f"tools of type '{tool.type}' are not supported (function tools only)",
                param=f"tools[{i}].type",
            )
        if not tool.name:
            raise Unsupported(f"tools[{i}] needs a name", param=f"tools[{i}].name")
        function: dict[str, Any] = {"name": tool.name, "description": tool.description}
        function |= {"parameters": tool.parameters, "strict": tool.strict}
        tools.append({"type": "function", "function": function})
    return tools


def _chat_format(body: ResponsesRequest) -> dict[str, Any] | None:
    fmt = body.text.format if body.text is not None else None
    if fmt is None or fmt.type != "json_schema":
        return None if fmt is None else {"type": fmt.type}
    schema = {"name": fmt.name or "response", "schema": fmt.schema_, "strict": fmt.strict}
    return {"type": "json_schema", "json_schema": schema}


def _chat_tool_choice(body: ResponsesRequest) -> Any:
    choice = body.tool_choice
    if isinstance(choice, NamedFunctionChoice):
        return {"type": "function", "function": {"name": choice.name}}
    return choice


def chat_request(body: ResponsesRequest, history: list[dict[str, Any]]) -> ChatCompletionRequest:
    """The chat request that runs ``body`` after ``history`` (the stored conversation
    of ``previous_response_id``, without its instructions, which do not carry over)."""
    messages = list(history)
    if body.instructions:
        messages.insert(0, {"role": "system", "content": body.instructions})
    messages += input_messages(body)
    fields = body.model_dump(
        include=set(GenerationParams.model_fields) - {"max_tokens", "n"}, by_alias=True
    )
    fields |= {
        "messages": messages,
        "max_completion_tokens": body.max_output_tokens or body.max_tokens,
        "tools": _chat_tools(body),
        "tool_choice": _chat_tool_choice(body),
        "parallel_tool_calls": body.parallel_tool_calls,
        "response_format": _chat_format(body),
    }
    try:
        return ChatCompletionRequest.model_validate(fields, strict=False)
    except ValidationError as exc:
        # What the Responses body allows but a chat request does not (a tool's name).
        error = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in error["loc"])
        raise InvalidRequest(
            f"{where}: {error['msg']}", param=_responses_param(where), code="invalid_value"
        ) from exc


def _responses_param(chat_param: str) -> str:
    """The Responses request's name for a parameter of the chat request it became."""
    if chat_param.startswith("tools."):
        index = chat_param.split(".")[1]
        return f"tools[{index}].{chat_param.split('.')[-1]}"
    if chat_param.startswith("response_format"):
        return "text.format"
    return chat_param


def conversation_messages(chat: ChatCompletionRequest, instructions: str | None) -> list[Any]:
    """The messages to store for a follow-up turn: all but the instructions."""
    messages = [m.model_dump(exclude_none=True) for m in chat.messages]
    if instructions:
        messages = messages[1:]
    return messages
