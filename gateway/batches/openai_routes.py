"""OpenAI's Files and Batches APIs, as the `openai` SDK calls them, in OpenAI's error envelope. Every file and
batch belongs to the caller's team: another team's id is a 404, as is one that never existed.

    POST /v1/files (multipart: purpose=batch, file)   GET /v1/files[?purpose&limit&after&order]
    GET /v1/files/{id}   DELETE /v1/files/{id}   GET /v1/files/{id}/content
    POST /v1/batches {input_file_id, endpoint, completion_window: "24h", metadata}
    GET /v1/batches/{id}   GET /v1/batches[?after&limit]   POST /v1/batches/{id}/cancel
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

import msgspec
from litestar import Request, Router, delete, get, post
from litestar.di import Provide
from litestar.params import Parameter
from litestar.response import Stream

from auth import Principal
from common.errors import BadRequest, UnsupportedMediaType
from common.json_body import read_json, read_optional_json
from gateway.batches import lines as checks
from gateway.batches.files import file_object
from gateway.batches.lines import Line
from gateway.batches.objects import COMPLETION_WINDOW, openai_batch
from gateway.batches.service import BatchService
from gateway.batches.upload import UPLOAD_PATH, receive_upload
from gateway.dialects import bounds
from gateway.dialects.openai.routes import OPENAI
from gateway.errors import NotFound
from gateway.serving.dialect import check, required

MAX_ID_CHARS = 128
MAX_LIMIT = 100
MAX_FILE_LIMIT = 10_000  # OpenAI's bound on a files list page
MULTIPART_SLACK = 64 << 10  # the form's boundaries and other fields around the file


def _principal(request: Request) -> Principal:
    return request.user


def _limit(limit: int | None, default: int, most: int) -> int:
    limit = default if limit is None else limit
    check(1 <= limit <= most, f"limit must be between 1 and {most}", "limit")
    return limit


async def _file(batches: BatchService, team_id: str, file_id: str, param: str = "file_id") -> tuple:
    row = None if len(file_id) > MAX_ID_CHARS else await batches.files.get(team_id, file_id)
    if row is None:
        raise NotFound(f"No such File object: {file_id[:MAX_ID_CHARS]}", param=param, code="file_not_found")
    return row


async def _batch(batches: BatchService, team_id: str, batch_id: str):
    found = None if len(batch_id) > MAX_ID_CHARS else await batches.store.get(team_id, "openai", batch_id)
    if found is None:
        raise NotFound(f"No batch found with id '{batch_id[:MAX_ID_CHARS]}'.", param="batch_id",
                       code="batch_not_found")
    return found


async def upload(request: Request, batches: BatchService) -> dict:
    """`files.create(file=..., purpose="batch")`: a JSONL file streamed to storage as it arrives (upload.py), within
    `max_file_bytes` (413), `max_file_lines` lines of `max_line_bytes` and the team's quota."""
    content_type = request.headers.get("content-type", "")
    if not content_type.lower().startswith("multipart/form-data"):
        raise UnsupportedMediaType("upload a file as multipart/form-data with the fields `purpose` and `file`")
    return await receive_upload(request, batches.files, _principal(request).team_id, batches.settings.batches)


@get("/v1/files", summary="OpenAI Files: the team's files", tags=["OpenAI"])
async def list_files(request: Request, batches: BatchService, purpose: str | None = None,
                     limit: Annotated[int | None, Parameter(ge=1, le=MAX_FILE_LIMIT)] = None,
                     after: str | None = None, order: Literal["asc", "desc"] | None = None) -> dict:
    limit = _limit(limit, MAX_FILE_LIMIT, MAX_FILE_LIMIT)
    order = order or "desc"
    check(order in ("asc", "desc"), "order must be asc or desc", "order")
    rows, more = await batches.files.list(_principal(request).team_id, purpose, after[:MAX_ID_CHARS] if after else None,
                                          limit, order == "asc")
    data = [file_object(row) for row in rows]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": more}


@get("/v1/files/{file_id:str}", summary="OpenAI Files: one file", tags=["OpenAI"])
async def retrieve_file(request: Request, batches: BatchService, file_id: str) -> dict:
    return file_object(await _file(batches, _principal(request).team_id, file_id))


@delete("/v1/files/{file_id:str}", status_code=200, summary="OpenAI Files: delete a file", tags=["OpenAI"])
async def delete_file(request: Request, batches: BatchService, file_id: str) -> dict:
    team_id = _principal(request).team_id
    await _file(batches, team_id, file_id)
    await batches.files.delete(team_id, file_id)
    return {"id": file_id, "object": "file", "deleted": True}


@get("/v1/files/{file_id:str}/content", summary="OpenAI Files: a file's bytes", tags=["OpenAI"])
async def file_content(request: Request, batches: BatchService, file_id: str) -> Stream:
    row = await _file(batches, _principal(request).team_id, file_id)
    return Stream(batches.files.chunks(row[0]), media_type="application/octet-stream")


@post("/v1/batches", status_code=200, summary="OpenAI Batches: create", tags=["OpenAI"])
async def create_batch(request: Request, batches: BatchService, payload: Any) -> dict:
    check(isinstance(payload, dict), "the request body must be a JSON object", "body")
    unknown = set(payload) - {"input_file_id", "endpoint", "completion_window", "metadata",
                              "output_expires_after"}
    check(not unknown, f"Unrecognized request argument supplied: {', '.join(sorted(unknown))[:200]}",
          next(iter(sorted(unknown)), "body"))
    endpoint, file_id = payload.get("endpoint"), payload.get("input_file_id")
    required(isinstance(file_id, str) and bool(file_id), "input_file_id")
    required(isinstance(endpoint, str) and bool(endpoint), "endpoint")
    check(endpoint in checks.OPENAI_URLS, f"endpoint must be one of {', '.join(checks.OPENAI_URLS)}", "endpoint")
    check(payload.get("completion_window") == COMPLETION_WINDOW, "completion_window must be '24h'",
          "completion_window")
    metadata = payload.get("metadata")
    check(metadata is None or isinstance(metadata, dict), "metadata must be an object of strings", "metadata")
    bounds.metadata(metadata)
    principal = _principal(request)
    row = await _file(batches, principal.team_id, file_id, "input_file_id")
    check(row[2] == "batch", f"The file {file_id} has purpose {row[2]!r}; a batch needs purpose 'batch'",
          "input_file_id")
    max_lines = batches.settings.batches.max_file_lines
    whole = checks.OpenAIFile(endpoint, max_lines)
    async for _ in _file_lines(batches, file_id, whole):  # first the whole file's checks, holding no line
        pass
    batch = await batches.store.create(principal.team_id, "openai", endpoint, file_id,
                                       msgspec.json.encode(principal).decode(), metadata, whole.checked,
                                       _file_lines(batches, file_id, checks.OpenAIFile(endpoint, max_lines)))
    batches.runner.wake()
    return openai_batch(batch, await batches.store.counts(batch.id))


async def _file_lines(batches: BatchService, file_id: str, check: checks.OpenAIFile) -> AsyncIterator[list[Line]]:
    """A batch file's lines as it is read, a piece at a time, each piece checked off the event loop."""
    async for piece in batches.files.chunks(file_id):
        yield await asyncio.to_thread(check.feed, piece)
    yield check.finish()


@get("/v1/batches/{batch_id:str}", summary="OpenAI Batches: one batch", tags=["OpenAI"])
async def retrieve_batch(request: Request, batches: BatchService, batch_id: str) -> dict:
    batch = await _batch(batches, _principal(request).team_id, batch_id)
    return openai_batch(batch, await batches.store.counts(batch.id))


@get("/v1/batches", summary="OpenAI Batches: the team's batches, newest first", tags=["OpenAI"])
async def list_batches(request: Request, batches: BatchService, after: str | None = None,
                       limit: Annotated[int | None, Parameter(ge=1, le=MAX_LIMIT)] = None) -> dict:
    limit = _limit(limit, 20, MAX_LIMIT)
    found, more = await batches.store.list(_principal(request).team_id, "openai",
                                           after[:MAX_ID_CHARS] if after else None, None, limit)
    data = [openai_batch(batch, await batches.store.counts(batch.id)) for batch in found]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": more}


@post("/v1/batches/{batch_id:str}/cancel", status_code=200, summary="OpenAI Batches: cancel", tags=["OpenAI"],
      dependencies={"payload": Provide(read_optional_json)})
async def cancel_batch(request: Request, batches: BatchService, batch_id: str, payload: Any) -> dict:
    batch = await _batch(batches, _principal(request).team_id, batch_id)
    if batch.status == "in_progress":
        await batches.store.cancel(batch)
        batches.runner.wake()
    elif batch.status not in ("cancelling", "cancelled"):
        raise BadRequest(f"Cannot cancel a batch with status '{batch.status}'.", param="batch_id",
                         code="batch_not_cancellable")
    batch = await _batch(batches, batch.team_id, batch_id)
    return openai_batch(batch, await batches.store.counts(batch.id))


def router(max_file_bytes: int) -> Router:
    files_create = post(UPLOAD_PATH, status_code=200, summary="OpenAI Files: upload (purpose batch)",
                        tags=["OpenAI"], request_max_body_size=max_file_bytes + MULTIPART_SLACK,
                        opt={"multipart": True})(upload)
    return Router(path="/", route_handlers=[files_create, list_files, retrieve_file, delete_file, file_content,
                                            create_batch, retrieve_batch, list_batches, cancel_batch],
                  dependencies={"payload": Provide(read_json)}, exception_handlers=OPENAI.exception_handlers())
