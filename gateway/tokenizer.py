"""Tokenize and detokenize on a ready worker of a model: the gateway holds no tokenizer."""

from __future__ import annotations

import msgspec

from gateway.errors import NotFound, Unavailable, ValidationFailed
from gateway.routing.pool import ModelPool, Replica, Router
from common.protocol import Error, TokenSpan

_json = msgspec.json.Encoder()
JSON_HEADERS = {"content-type": "application/json"}


def ready_replica(router: Router, name: str | None = None) -> tuple[ModelPool, Replica]:
    """The pool of `name` (default: the first served model) and its least loaded ready replica."""
    name = name or next(iter(router.pools), None)
    pool = router.pool(name) if name else None
    if pool is None:
        raise NotFound(f"the model {name!r} does not exist")
    replicas = pool.candidates()
    if not replicas:
        raise Unavailable(f"model {name!r} has no ready worker; retry shortly")
    return pool, replicas[0]


async def tokenize(router: Router, model: str, text: str) -> list[TokenSpan]:
    _, replica = ready_replica(router, model)
    response = await replica.client.post("/tokenize", content=_json.encode({"text": text}), headers=JSON_HEADERS)
    if response.status_code != 200:
        raise Unavailable(f"the worker could not tokenize ({response.status_code})")
    return msgspec.json.decode(response.content, type=list[TokenSpan])


async def detokenize(router: Router, model: str | None, tokens: list[int], skip_special_tokens: bool) -> bytes:
    """The worker's `DetokenizeResponse` JSON, relayed as it is; ids outside the vocabulary are a 422."""
    _, replica = ready_replica(router, model)
    sent = {"tokens": tokens, "skip_special_tokens": skip_special_tokens}
    response = await replica.client.post("/detokenize", content=_json.encode(sent), headers=JSON_HEADERS)
    if response.status_code != 200:
        raise ValidationFailed(msgspec.json.decode(response.content, type=Error).message, param="tokens")
    return response.content
