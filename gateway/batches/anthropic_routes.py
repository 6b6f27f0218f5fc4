"""Anthropic's Message Batches API, as the `anthropic` SDK calls it, in Anthropic's error envelope; every batch
belongs to the caller's team (another team's id is a 404 `not_found_error`).

    POST /v1/messages/batches {requests: [{custom_id, params}]}   GET /v1/messages/batches[?limit&after_id&before_id]
    GET /v1/messages/batches/{id}   POST /v1/messages/batches/{id}/cancel   DELETE /v1/messages/batches/{id}
    GET /v1/messages/batches/{id}/results   (JSONL: succeeded / errored / canceled / expired, once ended)
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from litestar import Request, Router, delete, get, post
from litestar.di import Provide
from litestar.params import Parameter
from litestar.response import Stream

from common.errors import BadRequest
from common.json_body import read_json, read_optional_json
from gateway.batches import lines as checks
from gateway.batches.objects import anthropic_batch
from gateway.batches.runner import anthropic_results
from gateway.batches.service import BatchService
from gateway.dialects.anthropic.dialect import MESSAGES
from gateway.errors import NotFound, ValidationFailed
from gateway.serving.dialect import check

MAX_ID_CHARS = 128
MAX_LIMIT = 1000


def _base_url(request: Request) -> str:
    return str(request.base_url).rstrip("/")


async def _batch(batches: BatchService, request: Request, batch_id: str):
    found = None if len(batch_id) > MAX_ID_CHARS else await batches.store.get(request.user.team_id, "anthropic",
                                                                             batch_id)
    if found is None:
        raise NotFound(f"No message batch found with id '{batch_id[:MAX_ID_CHARS]}'.", param="message_batch_id")
    return found


async def _object(batches: BatchService, request: Request, batch) -> dict:
    return anthropic_batch(batch, await batches.store.counts(batch.id), _base_url(request))


@post("/v1/messages/batches", status_code=200, summary="Anthropic Message Batches: create", tags=["Anthropic"])
async def create(request: Request, batches: BatchService, payload: Any) -> dict:
    check(isinstance(payload, dict), "the request body must be a JSON object", "body")
    for key in payload:
        if key != "requests":
            raise ValidationFailed(f"{key[:64]}: Extra inputs are not permitted", param=key[:64])
    checked = checks.anthropic_requests(payload.get("requests"), batches.settings.batches.max_file_lines)
    if checked.errors:
        first = checked.errors[0]
        where = f"requests.{first['line']}: " if first["line"] is not None else ""
        raise ValidationFailed(f"{where}{first['message']}", param=first["param"])
    principal = request.user
    batch = await batches.store.create(principal.team_id, "anthropic", checks.ANTHROPIC_URL, None,
                                       msgspec.json.encode(principal).decode(), None, checked)
    batches.runner.wake()
    return await _object(batches, request, batch)


@get("/v1/messages/batches/{batch_id:str}", summary="Anthropic Message Batches: one", tags=["Anthropic"])
async def retrieve(request: Request, batches: BatchService, batch_id: str) -> dict:
    return await _object(batches, request, await _batch(batches, request, batch_id))


@get("/v1/messages/batches", summary="Anthropic Message Batches: the team's, newest first", tags=["Anthropic"])
async def list_batches(request: Request, batches: BatchService,
                       limit: Annotated[int | None, Parameter(ge=1, le=MAX_LIMIT)] = None, after_id: str | None = None,
                       before_id: str | None = None) -> dict:
    limit = 20 if limit is None else limit
    check(1 <= limit <= MAX_LIMIT, f"limit must be between 1 and {MAX_LIMIT}", "limit")
    found, more = await batches.store.list(request.user.team_id, "anthropic",
                                           after_id[:MAX_ID_CHARS] if after_id else None,
                                           before_id[:MAX_ID_CHARS] if before_id else None, limit)
    data = [await _object(batches, request, batch) for batch in found]
    return {"data": data, "has_more": more, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None}


@post("/v1/messages/batches/{batch_id:str}/cancel", status_code=200, summary="Anthropic Message Batches: cancel",
      tags=["Anthropic"], dependencies={"payload": Provide(read_optional_json)})
async def cancel(request: Request, batches: BatchService, batch_id: str, payload: Any) -> dict:
    batch = await _batch(batches, request, batch_id)
    if batch.status == "in_progress":
        await batches.store.cancel(batch)
        batches.runner.wake()
    return await _object(batches, request, await _batch(batches, request, batch_id))


@delete("/v1/messages/batches/{batch_id:str}", status_code=200, summary="Anthropic Message Batches: delete",
        tags=["Anthropic"])
async def remove(request: Request, batches: BatchService, batch_id: str) -> dict:
    batch = await _batch(batches, request, batch_id)
    if batch.status in ("in_progress", "finalizing", "cancelling"):
        raise BadRequest("A message batch can be deleted only once it has ended; cancel it first.",
                         param="message_batch_id")
    await batches.store.delete(batch)
    return {"id": batch.id, "type": "message_batch_deleted"}


@get("/v1/messages/batches/{batch_id:str}/results", summary="Anthropic Message Batches: results (JSONL)",
     tags=["Anthropic"])
async def results(request: Request, batches: BatchService, batch_id: str) -> Stream:
    batch = await _batch(batches, request, batch_id)
    if batch.status in ("in_progress", "finalizing", "cancelling"):
        raise BadRequest("The batch's results are available once it has ended.", param="message_batch_id")
    return Stream(anthropic_results(batches.store, batch), media_type="application/x-jsonl")


def router() -> Router:
    return Router(path="/", route_handlers=[create, list_batches, retrieve, cancel, remove, results],
                  dependencies={"payload": Provide(read_json)}, exception_handlers=MESSAGES.exception_handlers())
