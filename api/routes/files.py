"""OpenAI's Files API, for batch input and output (``client.files``): see :mod:`api.batch.files`."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Form, Query, UploadFile
from fastapi.responses import PlainTextResponse

from api.admission.auth import Caller
from api.batch import files
from api.errors import InvalidRequest
from api.openapi import error_responses
from api.state import State

router = APIRouter(tags=["batch"])


def list_page(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """OpenAI's cursor page: the SDK's ``list`` follows ``last_id`` while ``has_more``."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


async def _text_of(upload: UploadFile, limit: int) -> str:
    raw = await upload.read(limit + 1)
    if len(raw) > limit:
        raise InvalidRequest(
            f"the file is larger than the limit of {limit} bytes",
            param="file",
            code="file_too_large",
        )
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise InvalidRequest(
            "the file must be UTF-8 text (JSONL)", param="file", code="invalid_file"
        ) from None


@router.post("/v1/files", responses=error_responses(400, 401, 413))
async def upload(
    file: UploadFile, purpose: Annotated[str, Form()], state: State, owner: Caller
) -> dict[str, Any]:
    if purpose != "batch":
        raise InvalidRequest(
            f"purpose must be 'batch' here, got '{purpose}'", param="purpose", code="invalid_value"
        )
    policy = state.policy.pool()  # a file has no model yet: the pool's bounds
    text = await _text_of(file, policy.batch_max_file_bytes)
    lines = sum(1 for line in text.splitlines() if line.strip())
    if lines > policy.batch_max_lines:
        raise InvalidRequest(
            f"the file has {lines} lines, more than the limit of {policy.batch_max_lines}",
            param="file",
            code="too_many_lines",
        )
    meta = await files.save(
        state.redis,
        content=text,
        filename=file.filename or "upload.jsonl",
        purpose="batch",
        owner=owner,
        ttl_seconds=policy.batch_ttl_seconds,
    )
    return meta.public()


@router.get("/v1/files", responses=error_responses(401))
async def list_files(
    state: State,
    owner: Caller,
    purpose: str | None = None,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
) -> dict[str, Any]:
    found, more = await files.listed(state.redis, owner, purpose=purpose, after=after, limit=limit)
    return list_page([f.public() for f in found], more)


@router.get("/v1/files/{file_id}", responses=error_responses(401, 404))
async def retrieve_file(file_id: str, state: State, owner: Caller) -> dict[str, Any]:
    return (await files.find(state.redis, file_id, owner)).public()


@router.get(
    "/v1/files/{file_id}/content",
    response_class=PlainTextResponse,
    responses=error_responses(401, 404),
)
async def file_content(file_id: str, state: State, owner: Caller) -> PlainTextResponse:
    text = await files.content(state.redis, file_id, owner)
    return PlainTextResponse(text, media_type="application/jsonl")


@router.delete("/v1/files/{file_id}", responses=error_responses(401, 404))
async def delete_file(file_id: str, state: State, owner: Caller) -> dict[str, Any]:
    await files.delete(state.redis, file_id, owner)
    return {"id": file_id, "object": "file", "deleted": True}
