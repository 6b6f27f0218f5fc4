"""One batch line through the serving pipeline's own stages (gateway/serving/pipeline.py: parse, authorize,
admit, lease, relay, settle), as the batch's team and key: the same validation, endpoint authorization, budgets,
workers and one ledger record per line (request id derived from the batch and the line, marked with the batch
id and custom_id) as an interactive request. Two things differ, on purpose:

- the interactive rate limits (rpm, tpm, concurrency) are not charged: batch tokens count against the team's
  enqueued-token limit when the batch is created (store.py). Budgets in money and tokens apply as always.
- the worker requests are marked `priority="batch"`: the worker runs them below interactive requests (the
  engine's README, "Batch priority").
- a refusal that waiting cures (the endpoint's queue full or its wait over, the ledger away) is not the line's
  result: nothing is recorded, the line goes back to pending and runs later (`Outcome.retry`).

There is no HTTP request: the pipeline gets a Request over a synthetic ASGI scope whose client never leaves."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, cast

import msgspec
from litestar import Request
from litestar.types import HTTPDisconnectEvent, HTTPScope

from auth import Principal
from auth.errors import AuthError
from billing.batch_mark import BatchMark
from common.errors import LedgerUnavailable
from gateway.batches.store import Claimed
from gateway.dialects.anthropic.dialect import MESSAGES
from gateway.dialects.openai.routes import CHAT, OPENAI
from gateway.dialects.responses.dialect import OpenAIResponses
from gateway.endpoints.errors import EndpointUnavailable
from gateway.errors import SluiceError, ValidationFailed, as_sluice_error
from gateway.serving import admission
from gateway.serving.accounting import Accounting
from gateway.serving.context import RequestContext
from gateway.serving.dialect import Dialect, Parsed
from gateway.serving.pipeline import admit, authorize, lease, parse, relay
from gateway.serving.request_scope import OUTCOME, REQUEST_ID, enter
from gateway.serving.services import Services

RETRIED = (EndpointUnavailable, LedgerUnavailable)  # refusals that time cures: the line runs again later


def dialect_of(url: str) -> Dialect:
    if url == "/v1/chat/completions":
        return CHAT
    if url == "/v1/completions":
        return OPENAI
    if url == "/v1/responses":
        return OpenAIResponses([], None)  # nothing stored: a batch line's response is its output line
    return MESSAGES


@dataclass
class Outcome:
    status_code: int
    body: dict | None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    retry: bool = False


class BatchAccounting(Accounting):
    """A batch line's accounting: budgets but not the interactive rate limits; no record for a retried refusal."""

    async def admit(self, parsed: Parsed) -> None:
        self.expected_dones = len(parsed.requests)
        services = self.services
        admission.refuse_overflow(services.router, parsed)
        tokens = admission.reservation(services.router, parsed)
        self.budget_hold = await services.budgets.reserve(self.principal, parsed.model, tokens, self.arrived)
        self.reached_worker = True
        self.dispatched = time.perf_counter()

    async def _record(self, ledger, status, latency, ttft, error) -> None:
        if isinstance(error, RETRIED) or status == "cancelled":
            return  # the line runs again (refused for now; its gateway stopping): its one record is that run's
        await super()._record(ledger, status, latency, ttft, error)


async def _never_leaves() -> HTTPDisconnectEvent:
    await asyncio.Event().wait()
    return {"type": "http.disconnect"}


def synthetic_request(url: str, principal: Principal, request_id: str) -> Request:
    scope: dict[str, Any] = {
        "type": "http", "method": "POST", "path": url, "raw_path": url.encode(), "query_string": b"",
        "headers": [], "client": None, "server": None, "scheme": "http", "root_path": "",
        "state": {REQUEST_ID: request_id}, "user": principal, "path_params": {}}
    return Request(cast(HTTPScope, scope), _never_leaves)  # only the keys the pipeline reads


async def key_refusal(services: Services, principal: Principal) -> AuthError | None:
    """Why the batch's key may no longer run lines (revoked or expired since the batch was made), else None."""
    key = await services.auth.store.get_key(principal.key_id)
    if key is None or key.revoked_at is not None:
        return AuthError(401, "revoked_api_key", "The API key that created this batch has been revoked.")
    if key.expires_at is not None and key.expires_at <= time.time():
        return AuthError(401, "expired_api_key", "The API key that created this batch has expired.")
    return None


async def run_line(services: Services, principal: Principal, url: str, line: Claimed, request_id: str) -> Outcome:
    """Run one line; its outcome (the dialect's JSON answer or error body, with its status)."""
    dialect = dialect_of(url)
    if (refusal := await key_refusal(services, principal)) is not None:
        return Outcome(refusal.status, dialect.error_body(refusal)[1])
    request = synthetic_request(url, principal, request_id)
    accounting = BatchAccounting(services, principal, request_id, dialect.name, url,
                                 request.scope["state"].setdefault(OUTCOME, {}),
                                 batch=BatchMark(line.batch_id, line.custom_id))
    context = RequestContext(request, services, dialect, url, request_id, principal, accounting)
    enter(request, context)
    body = dict(line.body)
    try:
        try:
            if body.get("stream"):
                raise ValidationFailed("stream is not supported in a batch request: its answer is the output "
                                       "line", param="stream")
            body.pop("stream", None)
            await parse(context, body)
            authorize(context)
            await admit(context)
            for generate in cast(Parsed, context.parsed).requests:  # below interactive requests: idle rows only
                generate.priority = "batch"
            waiting = await lease(context)
            answer = await relay(context, waiting)
            content = cast(bytes, answer.content)  # collected: a batch line is never streamed (refused above)
            return Outcome(answer.status_code or 200, msgspec.json.decode(content),
                           accounting.prompt_tokens, accounting.completion_tokens)
        except SluiceError as error:
            return await _refused(context, error)
        except Exception as fault:  # a fault: the line's error, settled once like any request's
            failure = as_sluice_error(fault)
            await context.settle("error", failure)
            return Outcome(failure.status, dialect.error_body(failure)[1])
    finally:
        left = context.close(None)
        if left is not None:
            await left


async def _refused(context: RequestContext, error: SluiceError) -> Outcome:
    error = context.dialect.reported(error)
    accounting = context.accounting
    await context.settle(accounting.failure_status(error), error)
    status, body = context.dialect.error_body(error)
    return Outcome(status, body, accounting.prompt_tokens, accounting.completion_tokens,
                   retry=isinstance(error, RETRIED))
