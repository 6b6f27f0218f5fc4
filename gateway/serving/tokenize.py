"""Tokenize and detokenize on a ready worker of a model: the gateway holds no tokenizer.

A tokenizer call is work on a worker like a generation: it needs the key's permission for the model and
counts against the key's and the team's request rate and concurrency (no tokens reserved, none billed)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import msgspec

from auth import Principal
from common.protocol import Error, TokenSpan
from gateway.errors import Unavailable, ValidationFailed
from gateway.replicas.pool import ModelPool, Replica, ready_replica
from gateway.serving.admission import admit_tokens
from gateway.serving.services import Services

_json = msgspec.json.Encoder()
JSON_HEADERS = {"content-type": "application/json"}


@asynccontextmanager
async def tokenizer_call(services: Services, principal: Principal,
                         model: str | None) -> AsyncIterator[tuple[ModelPool, Replica]]:
    """A permitted, admitted tokenizer call on a ready replica of `model` (unset: the first endpoint the caller may
    see), which the caller may see and call as for a generation; the limits settle on exit."""
    name = services.callable_model(principal, model)
    ticket = await admit_tokens(services.limiter, principal, 0)
    try:
        yield ready_replica(services.router, name)
    finally:
        await services.limiter.settle(ticket, 0)


async def tokenize(replica: Replica, text: str) -> list[TokenSpan]:
    response = await replica.client.post("/tokenize", content=_json.encode({"text": text}), headers=JSON_HEADERS)
    if response.status_code != 200:
        raise Unavailable(f"the worker could not tokenize ({response.status_code})")
    return msgspec.json.decode(response.content, type=list[TokenSpan])


async def detokenize(replica: Replica, tokens: list[int], skip_special_tokens: bool) -> bytes:
    """The worker's `DetokenizeResponse` JSON, relayed as it is; ids outside the vocabulary are a 422."""
    sent = {"tokens": tokens, "skip_special_tokens": skip_special_tokens}
    response = await replica.client.post("/detokenize", content=_json.encode(sent), headers=JSON_HEADERS)
    if response.status_code != 200:
        raise ValidationFailed(msgspec.json.decode(response.content, type=Error).message, param="tokens")
    return response.content
