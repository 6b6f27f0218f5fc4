"""Anthropic's Messages API: `POST /v1/messages` (streamed or not) and `POST /v1/messages/count_tokens`.

Authenticated by `x-api-key` (the Anthropic SDKs' header) or the bearer key; `anthropic-version` and
`anthropic-beta` are accepted and change nothing. Every error of these routes, the authentication's included, is
in Anthropic's envelope."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Router, post
from litestar.di import Provide
from litestar.response import Response, Stream

from common.json_body import read_json
from gateway.dialects.anthropic.dialect import MESSAGES
from gateway.dialects.anthropic.request import (
    TOLERATED,
    CountTokensBody,
    MessagesBody,
    conversation,
    output_format,
    prefill,
    tools,
)
from gateway.dialects.fast_path import DIRECT
from gateway.dialects.openapi import documented
from gateway.errors import ValidationFailed
from gateway.serving.dialect import convert, required, unknown_fields
from gateway.serving.pipeline import handle_generation
from gateway.serving.services import Services
from gateway.serving.tokenize import tokenizer_call

_json = msgspec.json.Encoder()


@post("/v1/messages", status_code=200, summary="Anthropic Messages API", tags=["Anthropic"],
      operation_class=documented(MessagesBody, closed=True), opt=DIRECT)
async def messages(request: Request, services: Services) -> Response | Stream:
    return await handle_generation(request, services, MESSAGES, "/v1/messages")


@post("/v1/messages/count_tokens", status_code=200, summary="Anthropic: count a conversation's input tokens",
      tags=["Anthropic"], operation_class=documented(CountTokensBody, closed=True))
async def count_tokens(request: Request, services: Services, payload: Any) -> dict:
    """The tokens of the conversation as the model's chat template lays it out (a tokenizer call: the key's
    permission for the model and its request limits apply, nothing is billed)."""
    for key in unknown_fields(payload, CountTokensBody, TOLERATED):
        raise ValidationFailed(f"{key}: Extra inputs are not permitted", param=key)
    body = convert(payload, CountTokensBody)
    required(bool(body.model), "model")
    turns = conversation(body)
    continued = prefill(turns)  # a prefill is counted as the generation lays it out: its turn left open
    output_format(body)  # checked as a generation checks it
    offered = tools(body)  # laid out by the worker as a generation would: the tool prompt counts too
    try:
        async with tokenizer_call(services, request, body.model) as tokenizer:
            spans = await tokenizer.tokenize_chat(turns, offered, continue_final_message=continued)
    except ValidationFailed as refused:  # the worker's refusal of the conversation (its template, its size)
        raise ValidationFailed(refused.message, param=refused.param or "messages") from refused
    return {"input_tokens": len(spans)}


def router() -> Router:
    return Router(path="/", route_handlers=[messages, count_tokens], dependencies={"payload": Provide(read_json)},
                  exception_handlers=MESSAGES.exception_handlers())
