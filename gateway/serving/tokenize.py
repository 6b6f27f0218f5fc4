"""Tokenize and detokenize on a worker of a model, through the worker client: the gateway holds no tokenizer.

A tokenizer call is work on a worker like a generation: it needs the key's permission for the model, counts
against the key's and the team's request rate and concurrency (no tokens reserved, none billed), and takes a
lease on the endpoint like a generation (it wakes a scaled-to-zero endpoint and waits for it, and it counts in
the endpoint's load)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import msgspec

from auth import Principal
from common.protocol import TokenSpan
from gateway.endpoints.controller import EndpointController
from gateway.serving.admission import admit_tokens
from gateway.serving.pipeline import tenant_of
from gateway.serving.services import Services
from gateway.serving.worker_client import WorkerClient

_json = msgspec.json.Encoder()
_spans = msgspec.json.Decoder(list[TokenSpan])


@dataclass(frozen=True)
class Tokenizer:
    """The tokenizer of one endpoint, on its workers (each call one leased worker call)."""

    workers: WorkerClient
    endpoint: EndpointController
    tenant: str

    async def tokenize(self, text: str) -> list[TokenSpan]:
        return _spans.decode(await self._call("/tokenize", {"text": text}))

    async def tokenize_chat(self, messages: list[dict[str, Any]], tools: Any) -> list[TokenSpan]:
        """The tokens of a conversation as the model's chat template lays it out (the tool prompt included)."""
        return _spans.decode(await self._call("/tokenize", {"messages": messages, "tools": tools}))

    async def detokenize(self, tokens: list[int], skip_special_tokens: bool) -> bytes:
        """The worker's `DetokenizeResponse` JSON, relayed as it is; ids outside the vocabulary are a 422."""
        return await self._call("/detokenize", {"tokens": tokens, "skip_special_tokens": skip_special_tokens})

    async def _call(self, path: str, body: dict[str, Any]) -> bytes:
        return await self.workers.call(self.endpoint, path, _json.encode(body), tenant=self.tenant)


@asynccontextmanager
async def tokenizer_call(services: Services, principal: Principal, model: str | None) -> AsyncIterator[Tokenizer]:
    """A permitted, admitted tokenizer call on `model` (unset: the first endpoint the caller may see), which the
    caller may see and call as for a generation; the limits settle on exit."""
    name = services.callable_model(principal, model)
    ticket = await admit_tokens(services.limiter, principal, 0)
    try:
        yield Tokenizer(services.workers, services.endpoints.resolve(name, principal), tenant_of(principal.team_id))
    finally:
        await services.limiter.settle(ticket, 0)
