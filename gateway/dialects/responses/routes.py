"""OpenAI's Responses API: `POST /v1/responses` (streamed or not), `GET` and `DELETE /v1/responses/{id}`,
`GET /v1/responses/{id}/input_items` (input_items.py) and `POST /v1/responses/input_tokens` (the input's tokens as a
generation would prefill them: a tokenizer call, nothing billed).

Responses are stored unless `store` is false (OpenAI's default is to store), per team: the routes and
`previous_response_id` see only the caller's team's responses; another team's id is a 404, as is one that
never existed, or one past its retention. A create that could not be stored (over the size of one stored
response, a team at its quota, storage low: gateway/dialects/responses/store.py) is refused before any work."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Router, delete, get, post
from litestar.di import Provide
from litestar.response import Response, Stream

from auth import Principal
from common.json_body import read_json
from gateway.dialects import bounds
from gateway.dialects.openapi import documented
from gateway.dialects.responses.dialect import OpenAIResponses
from gateway.dialects.responses.input_items import items_of, page
from gateway.dialects.responses.request import (
    INCLUDABLE,
    CountBody,
    ResponsesBody,
    input_turns,
    text_format,
    tools,
)
from gateway.dialects.responses.store import ResponseStore, policy_of, response_store
from gateway.errors import NotFound, SluiceError, ValidationFailed
from gateway.serving.dialect import check, convert, required
from gateway.serving.pipeline import handle_generation
from gateway.serving.services import Services
from gateway.serving.tokenize import tokenizer_call

DEFAULT = OpenAIResponses()  # renders the errors of these routes
_json = msgspec.json.Encoder()
MAX_ID_CHARS = 128


def store_of(services: Services) -> ResponseStore:
    return response_store(services.auth.store.db, policy_of(services.settings))


async def stored(services: Services, principal: Principal, response_id: str, param: str):
    found = None if len(response_id) > MAX_ID_CHARS else await store_of(services).get(principal.team_id,
                                                                                       response_id)
    if found is None:
        raise NotFound(f"Response with id '{response_id[:MAX_ID_CHARS]}' not found.", param=param,
                       code="response_not_found")
    return found


@post("/v1/responses", status_code=200, summary="OpenAI Responses API", tags=["OpenAI"],
      operation_class=documented(ResponsesBody, closed=True))
async def create(request: Request, services: Services, payload: Any) -> Response | Stream:
    principal: Principal = request.user
    history: list[dict] = []
    previous = payload.get("previous_response_id") if isinstance(payload, dict) else None
    try:
        if previous is not None:
            if not isinstance(previous, str):
                raise ValidationFailed("previous_response_id must be a response id", param="previous_response_id")
            history = (await stored(services, principal, previous, "previous_response_id")).messages
    except SluiceError as error:
        return DEFAULT.error_response(error)
    store = store_of(services)
    keep = isinstance(payload, dict) and payload.get("store") is not False  # not a dict: parse refuses it
    if keep:
        try:  # the stored size before the output: the body as sent and the conversation it continues
            metadata = payload.get("metadata")
            bounds.metadata(metadata if isinstance(metadata, dict) else None)  # its own error before the size's
            await store.admit(principal.team_id, len(_json.encode(payload)) + len(_json.encode(history)), "input")
        except SluiceError as error:
            return DEFAULT.error_response(error)

    async def save(response: dict, messages: list[dict]) -> None:
        await store.save(principal.team_id, response, messages)

    dialect = OpenAIResponses(history, save if keep else None)
    answer = await handle_generation(request, services, dialect, "/v1/responses", payload)
    if not isinstance(answer, Stream) and (answer.status_code or 200) == 200:  # None: the route's own 200
        # a collected answer (a stream stores its own before it ends); one that no longer fit says store: false
        if (unstored := await dialect.store_pending()) is not None:
            answer.content = _json.encode(unstored)
    return answer


@get("/v1/responses/{response_id:str}", summary="A stored response of the caller's team", tags=["OpenAI"])
async def retrieve(request: Request, services: Services, response_id: str) -> dict:
    return (await stored(services, request.user, response_id, "response_id")).response


@delete("/v1/responses/{response_id:str}", status_code=200, summary="Delete a stored response", tags=["OpenAI"])
async def remove(request: Request, services: Services, response_id: str) -> dict:
    await stored(services, request.user, response_id, "response_id")
    await store_of(services).delete(request.user.team_id, response_id)
    return {"id": response_id, "object": "response", "deleted": True}


@get("/v1/responses/{response_id:str}/input_items", summary="The input items of a stored response",
     tags=["OpenAI"])
async def input_items(request: Request, services: Services, response_id: str, limit: int | None = None,
                      order: str | None = None, after: str | None = None, before: str | None = None) -> dict:
    found = await stored(services, request.user, response_id, "response_id")
    # `include[]=` (the SDKs' list form) or `include=`; nothing of theirs is in an input here (no images, no tools)
    include = request.query_params.getall("include[]", []) + request.query_params.getall("include", [])
    for value in include:
        check(value in INCLUDABLE, f"include: {value[:128]!r} is not one of {', '.join(sorted(INCLUDABLE))}",
              "include")
    return page(items_of(response_id, found.messages[:-1]), limit=limit, order=order, after=after, before=before)


@post("/v1/responses/input_tokens", status_code=200, summary="OpenAI Responses: count the input's tokens",
      tags=["OpenAI"], operation_class=documented(CountBody, closed=True))
async def input_tokens(request: Request, services: Services, payload: Any) -> dict:
    """The tokens a response to this input would be prompted with: the chat template over the instructions, the
    previous response's conversation, the input, and the tool prompt when tools are offered. The key's permission
    for the model and its request limits apply; nothing is billed."""
    DEFAULT.refuse_unknown(payload, CountBody)
    body = convert(payload, CountBody)
    required(bool(body.model), "model")
    history = []
    if body.previous_response_id is not None:
        history = (await stored(services, request.user, body.previous_response_id, "previous_response_id")).messages
    turns = history + input_turns(body.input)
    messages = ([{"role": "system", "content": body.instructions}] if body.instructions else []) + turns
    text_format(body.text)  # checked as a response checks it
    offered = tools(body, body.model)
    try:
        async with tokenizer_call(services, request, body.model) as tokenizer:
            spans = await tokenizer.tokenize_chat(messages, offered)
    except ValidationFailed as refused:  # the worker's refusal of the conversation (its template, its size)
        raise ValidationFailed(refused.message, param=refused.param or "input") from refused
    return {"object": "response.input_tokens", "input_tokens": len(spans)}


def router() -> Router:
    # input_tokens before the {response_id} routes: a POST there is never a response id's
    return Router(path="/", route_handlers=[create, input_tokens, retrieve, input_items, remove],
                  dependencies={"payload": Provide(read_json)}, exception_handlers=DEFAULT.exception_handlers())
