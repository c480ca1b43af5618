"""A batch's input file, line by line: parsed and validated before anything is made.

Each line is OpenAI's ``{"custom_id", "method": "POST", "url", "body"}``; the body is
validated by the same pydantic model as the live endpoint of ``url`` (and the same
checks of options llmq does not serve), so a line that the live endpoint would refuse
for its shape fails the batch at creation, with OpenAI's ``errors`` list (one entry
per bad line, with its 1-based line number). The limits that depend on the served
model (prompt length, a model no worker serves) are checked when the line runs, and a
line that fails them goes to the error file, as OpenAI does. All lines name one model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from api.batch.batch_store import LineError
from api.bodies import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from api.errors import ApiError
from api.extras import chat_extras, completion_extras
from api.responses.responses_input import ResponsesRequest

#: The endpoints a batch may run, each with the request model of its live route.
ENDPOINTS: dict[str, type[BaseModel]] = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
    "/v1/embeddings": EmbeddingRequest,
    "/v1/responses": ResponsesRequest,
}

#: The most line errors a failed batch reports.
MAX_ERRORS = 100


@dataclass
class Parsed:
    """A validated input file: its lines (``{"custom_id", "body"}`` JSON) and model,
    or the errors that fail it."""

    lines: list[str] = field(default_factory=list)
    model: str = ""
    errors: list[LineError] = field(default_factory=list)


def body_model(endpoint: str, body: dict[str, Any]) -> BaseModel:
    """The line's body as its endpoint's request (already validated at creation)."""
    return ENDPOINTS[endpoint].model_validate(body)


def _checked(endpoint: str, body: Any) -> BaseModel:
    """Validate one body as the live endpoint does; raise ValueError with the reason."""
    if not isinstance(body, dict):
        raise ValueError("body must be a JSON object")
    request = ENDPOINTS[endpoint].model_validate(body)
    if body.get("stream"):
        raise ValueError("stream must be false or absent in a batch line")
    try:
        if isinstance(request, CompletionRequest):
            completion_extras(request)
        elif isinstance(request, ChatCompletionRequest):
            chat_extras(request)
        elif isinstance(request, ResponsesRequest):
            request.refuse_unsupported()
            if request.previous_response_id is not None:
                raise ValueError("previous_response_id is not supported in a batch line")
    except ApiError as exc:
        raise ValueError(exc.message) from None
    return request


def _line_error(number: int, code: str, message: str, param: str | None = None) -> LineError:
    return LineError(code=code, message=message, param=param, line=number)


def _check_line(
    number: int, raw: str, endpoint: str, seen: set[str], parsed: Parsed
) -> LineError | None:
    try:
        line = json.loads(raw)
    except ValueError:
        return _line_error(number, "invalid_json_line", "the line is not valid JSON")
    if not isinstance(line, dict):
        return _line_error(number, "invalid_json_line", "the line must be a JSON object")
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return _line_error(
            number, "missing_required_parameter", "custom_id is required", "custom_id"
        )
    if custom_id in seen:
        return _line_error(
            number, "duplicate_custom_id", f"the custom_id '{custom_id}' is repeated", "custom_id"
        )
    seen.add(custom_id)
    if line.get("method", "POST") != "POST":
        return _line_error(number, "invalid_method", "method must be POST", "method")
    if line.get("url") != endpoint:
        return _line_error(
            number,
            "mismatched_url",
            f"url must be the batch's endpoint {endpoint}, got {line.get('url')!r}",
            "url",
        )
    try:
        request = _checked(endpoint, line.get("body"))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        return _line_error(number, "invalid_request", f"body: {where}: {first['msg']}", "body")
    except ValueError as exc:
        return _line_error(number, "invalid_request", f"body: {exc}", "body")
    model = str(getattr(request, "model", ""))
    if parsed.model and model != parsed.model:
        return _line_error(
            number,
            "model_mismatch",
            f"every line of a batch must name one model ({parsed.model!r}, not {model!r})",
            "body.model",
        )
    parsed.model = model
    parsed.lines.append(json.dumps({"custom_id": custom_id, "body": line["body"]}))
    return None


def parse(text: str, endpoint: str, max_lines: int) -> Parsed:
    """Every line of ``text`` checked (blank lines skipped); the errors of all bad ones."""
    parsed = Parsed()
    rows = [(n, raw) for n, raw in enumerate(text.splitlines(), 1) if raw.strip()]
    if not rows:
        parsed.errors.append(LineError(code="empty_file", message="the input file has no lines"))
        return parsed
    if len(rows) > max_lines:
        parsed.errors.append(
            LineError(
                code="too_many_lines",
                message=f"the input file has {len(rows)} lines, more than the limit of {max_lines}",
            )
        )
        return parsed
    seen: set[str] = set()
    for number, raw in rows:
        error = _check_line(number, raw, endpoint, seen, parsed)
        if error is not None and len(parsed.errors) < MAX_ERRORS:
            parsed.errors.append(error)
    if parsed.errors:
        parsed.lines.clear()
    return parsed
