"""Tokenize and detokenize on a worker of a model, through the worker client: the gateway holds no tokenizer.

A tokenizer call is work on a worker like a generation: it needs the key's permission for the model, counts
against the key's and the team's request rate and concurrency (no tokens reserved, none billed), and takes a
lease on the endpoint like a generation: it wakes a scaled-to-zero endpoint and waits for it (no longer than the
endpoint's max_wait_seconds and the caller's X-Scale-Up-Timeout; a client that disconnects leaves the queue at
once), and it counts in the endpoint's load. As Anthropic's token counting, it is free but for those limits; a
refusal (a model the key may not call, a text the worker refuses) counts against the rejection budget. On the
worker, tenants take turns at the tokenizer (worker/tenant_turns.py)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import msgspec
from litestar import Request

from common.headers import header
from common.protocol import TokenSpan
from gateway.endpoints.controller import EndpointController
from gateway.endpoints.deadline import SCALE_UP_TIMEOUT_HEADER, parse_scale_up_timeout, wait_deadline
from gateway.errors import SluiceError
from gateway.serving.admission import admit_tokens
from gateway.serving.client_gone import unless_gone
from gateway.serving.pipeline import tenant_of
from gateway.serving.rejections import count_rejection, refused_by_worker
from gateway.serving.services import Services
from gateway.serving.worker_client import WorkerClient

_json = msgspec.json.Encoder()
_spans = msgspec.json.Decoder(list[TokenSpan])


@dataclass(frozen=True)
class Tokenizer:
    """The tokenizer of one endpoint, on its workers (each call one leased worker call, for `request`)."""

    workers: WorkerClient
    endpoint: EndpointController
    tenant: str
    request: Request
    deadline: float  # when a wait for a replica gives up (on time.monotonic's clock)

    async def tokenize(self, text: str) -> list[TokenSpan]:
        return _spans.decode(await self._call("/tokenize", {"text": text}))

    async def tokenize_chat(self, messages: list[dict[str, Any]], tools: Any,
                            continue_final_message: bool = False) -> list[TokenSpan]:
        """The tokens of a conversation as the model's chat template lays it out (the tool prompt included; a final
        assistant message left open when it is continued)."""
        return _spans.decode(await self._call("/tokenize", {"messages": messages, "tools": tools,
                                                            "continue_final_message": continue_final_message}))

    async def detokenize(self, tokens: list[int], skip_special_tokens: bool) -> bytes:
        """The worker's `DetokenizeResponse` JSON, relayed as it is; ids outside the vocabulary are a 422."""
        return await self._call("/detokenize", {"tokens": tokens, "skip_special_tokens": skip_special_tokens})

    async def _call(self, path: str, body: dict[str, Any]) -> bytes:
        """One worker call: a replica free now, else a wait in the endpoint's queue that the client's leaving
        ends (ClientGone), as a generation's does."""
        activator = self.endpoint.activator
        lease = activator.take_free(tenant=self.tenant)
        if lease is None:
            lease = await unless_gone(self.request, activator.acquire(self.deadline, tenant=self.tenant))
        body = {**body, "tenant": self.tenant}  # the worker's tokenizer is shared in tenants' turns
        return await self.workers.call(self.endpoint, lease, path, _json.encode(body), self.deadline)


@asynccontextmanager
async def tokenizer_call(services: Services, request: Request, model: str | None) -> AsyncIterator[Tokenizer]:
    """A permitted, admitted tokenizer call of `request`'s caller on `model` (unset: the first endpoint the caller
    may see), which the caller may see and call as for a generation; the limits settle on exit. Its waits for a
    replica end as a generation's: at the earliest of the endpoint's max_wait_seconds and X-Scale-Up-Timeout."""
    principal = request.user
    try:
        name = services.callable_model(principal, model)
        header_s = parse_scale_up_timeout(header(request, SCALE_UP_TIMEOUT_HEADER))
        ticket = await admit_tokens(services.limiter, principal, 0)
        try:
            endpoint = services.endpoints.resolve(name, principal)
            deadline = wait_deadline(time.monotonic(), time.time(), max_wait_s=endpoint.spec.max_wait_seconds,
                                     header_s=header_s)
            yield Tokenizer(services.workers, endpoint, tenant_of(principal.team_id), request, deadline)
        finally:
            await services.limiter.settle(ticket, 0)
    except SluiceError as error:  # a refusal of what the call is, here or on the worker: the rejection budget's
        if not refused_by_worker(error):
            raise
        raise await count_rejection(services, request, error) from error
