"""Per-request bookkeeping: admission against limits, token counts from worker events, the ledger record.

`finish` runs exactly once per request whatever path it takes (ok, error, cancelled, rejected): its one caller
is `RequestContext.settle` (gateway/serving/context.py).
"""

from __future__ import annotations

import time

import structlog

from auth import Principal
from billing.batch_mark import BatchMark
from billing.records import FINISH_REASONS, UsageRecord
from common.errors import LedgerUnavailable
from common.protocol import Accepted, Done, Event, Finish, Token
from gateway import metrics
from gateway.errors import DeadlineExceeded, RequestTimedOut, SluiceError
from gateway.replicas.token_lines import TokenLines
from gateway.serving import admission
from gateway.serving.budget_gate import BudgetHold
from gateway.serving.dialect import Parsed
from gateway.serving.services import Services

log = structlog.get_logger("gateway")
# the worker's finish reasons in the ledger's words (billing.records.FinishReason)
LEDGER_FINISH = {"eos_token": "stop", "stop_sequence": "stop_sequence", "stop_token": "stop_sequence",
                 "length": "length", "tool_calls": "tool_calls", "cancelled": "cancelled", "error": "error"}
_RANK = {reason: rank for rank, reason in enumerate(FINISH_REASONS)}


class Accounting:
    def __init__(self, services: Services, principal: Principal, request_id: str, dialect: str, route: str,
                 outcome: dict, client_request_id: str | None = None, batch: BatchMark | None = None):
        self.services, self.principal = services, principal
        self.outcome = outcome  # the request's log line (`request_done`, written by gateway.edge.access_log)
        self.request_id, self.dialect, self.route = request_id, dialect, route
        self.client_request_id = client_request_id  # the caller's X-Request-Id: the ledger keeps it beside ours
        self.end_user: str | None = None  # the body's end user and tags (request_tags.py), once parsed
        self.tags: dict[str, str] = {}
        self.batch = batch  # the batch line this request runs for (None: interactive); priced at the batch rate
        self.model = ""
        self.adapter: str | None = None  # the LoRA adapter the request named (the ledger's `adapter`)
        self.arrived = time.time()  # selects the price in force
        self.started = time.perf_counter()
        self.dispatched = self.started  # set when admitted: what came before is the gateway's validation
        self.first_token: float | None = None
        self.ticket = None
        self.budget_hold: BudgetHold | None = None  # what the request reserved on its budgets (budget_gate.py)
        self.reached_worker = False
        self.prompt_tokens = self.completion_tokens = self.compute_tokens = 0
        self.cached_tokens = 0  # prompt tokens the workers' prefix caches supplied (known from their Done events)
        # of the completion tokens, the request's prediction's tokens the answers took and those refused (Done events)
        self.accepted_prediction_tokens = self.rejected_prediction_tokens = 0
        self.streamed_tokens = 0  # tokens seen before a Done (what a cancelled stream is billed)
        self.accepted_prompt_tokens = 0
        self.dones = 0
        self.expected_dones = 0
        self.worker_id = ""
        self.cold_start_ms = 0.0  # how long the request waited for a replica (the endpoint was waking)
        self.finish_reason: str | None = None  # the highest-ranked reason of the choices finished so far

    @property
    def complete(self) -> bool:
        return self.expected_dones > 0 and self.dones == self.expected_dones

    async def admit(self, parsed: Parsed) -> None:
        self.expected_dones = len(parsed.requests)
        services = self.services
        admission.refuse_overflow(services.router, parsed)  # a prompt no context holds reserves nothing
        tokens = admission.reservation(services.router, parsed)
        # budgets first: a request refused by one takes no rate-limit capacity
        self.budget_hold = await services.budgets.reserve(self.principal, parsed.model, tokens, self.arrived)
        self.ticket = await admission.admit_tokens(services.limiter, self.principal, tokens,
                                                   admission.sequences(parsed))
        self.reached_worker = True
        self.dispatched = time.perf_counter()

    def observe(self, event: Event | TokenLines) -> None:
        if isinstance(event, Accepted):
            self.accepted_prompt_tokens += event.prompt_tokens
            self.worker_id = event.worker_id or self.worker_id
        elif isinstance(event, Token):
            if self.first_token is None:
                self.first_token = time.perf_counter()
            self.streamed_tokens += 1
        elif isinstance(event, Done):
            self.dones += 1
            self.prompt_tokens += event.prompt_tokens
            self.completion_tokens += event.completion_tokens
            self.compute_tokens += event.compute_tokens
            self.cached_tokens += event.cached_tokens
            self.accepted_prediction_tokens += event.accepted_prediction_tokens
            self.rejected_prediction_tokens += event.rejected_prediction_tokens
            self.worker_id = event.worker_id or self.worker_id
        elif isinstance(event, Finish):
            reason = LEDGER_FINISH[event.reason]
            if self.finish_reason is None or _RANK[reason] < _RANK[self.finish_reason]:
                self.finish_reason = reason
        elif isinstance(event, TokenLines):  # a collected answer's tokens, undecoded: counted all the same
            if self.first_token is None:
                self.first_token = time.perf_counter()
            self.streamed_tokens += event.count

    def ledger_finish_reason(self, status: str, error: SluiceError | None) -> str | None:
        """Why the answer ended, as the ledger records it: the request's own end when it did not complete (the
        client left, a timeout, an error), else its choices' (ranked: billing.records.FinishReason); None for a
        request refused before any answer."""
        if status == "rejected":
            return None
        if status == "cancelled":
            return "cancelled"
        if isinstance(error, RequestTimedOut | DeadlineExceeded):
            return "timeout"
        if status == "error":
            return "error"
        return self.finish_reason

    def failure_status(self, error: SluiceError) -> str:
        """Refused before anything was generated (invalid, rate-limited, over a limit): `rejected`, billed
        zero tokens. A failure after tokens were produced, or a server fault: `error`."""
        generated = self.streamed_tokens > 0 or self.completion_tokens > 0
        return "rejected" if error.status < 500 and not generated else "error"

    def headers(self) -> dict[str, str]:
        return self.ticket.headers() if self.ticket is not None else {}

    async def finish(self, status: str, error: SluiceError | None = None) -> None:
        """Settle the limits, count the metrics, fill in the log line and write the ledger record. An `ok` whose
        record cannot be made durable raises LedgerUnavailable: the answer is withheld."""
        if not self.complete and self.reached_worker:
            # cancelled or failed mid-way: bill what the worker generated and we relayed
            self.prompt_tokens = max(self.prompt_tokens, self.accepted_prompt_tokens)
            self.completion_tokens = max(self.completion_tokens, self.streamed_tokens)
            self.compute_tokens = max(self.compute_tokens, self.completion_tokens)
        used = self.prompt_tokens + self.compute_tokens
        if self.ticket is not None:
            await self.services.limiter.settle(self.ticket, used)
        if self.budget_hold is not None:  # the ledger's cost rule: output = the larger of compute and completion
            await self.services.budgets.settle(self.budget_hold, self.prompt_tokens,
                                               max(self.compute_tokens, self.completion_tokens), self.compute_tokens,
                                               cached_tokens=self.cached_tokens, batch=self.batch is not None)
        latency = (time.perf_counter() - self.started) * 1000
        metrics.observe(self, status)
        self.outcome.update(request_id=self.request_id, status=status, route=self.route,
                            prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens,
                            latency_ms=round(latency, 2), cold_start_ms=round(self.cold_start_ms, 2),
                            error=error.code if error else None, adapter=self.adapter)
        ledger = self.services.ledger
        if ledger is None or isinstance(error, LedgerUnavailable):  # refused for want of a ledger: nothing to add
            return
        ttft = (self.first_token - self.started) * 1000 if self.first_token is not None else None
        try:
            await self._record(ledger, status, latency, ttft, error)
        except LedgerUnavailable as failure:
            log.error("ledger_record_failed", request_id=self.request_id, status=status, error=failure.message)
            if status == "ok":
                raise  # the answer is withheld: never served unbilled
        if self.services.health is not None and status in ("ok", "error"):  # answered, or failed once admitted
            limits = self.principal.team_limits  # judged on the fleet's ledger, which now holds this request
            self.services.health.observe(self.principal.team_id, limits.health_alerts if limits else None,
                                         self.arrived)

    async def _record(self, ledger, status: str, latency: float, ttft: float | None,
                      error: SluiceError | None) -> None:
        failed = error is not None or status == "error"  # an error without a SluiceError: an unexpected fault
        await ledger.record(UsageRecord(
            request_id=self.request_id, time=self.arrived, team_id=self.principal.team_id,
            key_id=self.principal.key_id, user_id=self.principal.user_id, model=self.model, dialect=self.dialect,
            route=self.route, prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens,
            compute_tokens=self.compute_tokens, status=status, latency_ms=latency, ttft_ms=ttft,
            worker_id=self.worker_id, error_code=(error.code if error else "internal_error") if failed else None,
            error_status=(error.status if error else 500) if failed else None, adapter=self.adapter or "",
            cold_start_ms=self.cold_start_ms or None,  # None: it did not wait for its endpoint to wake
            finish_reason=self.ledger_finish_reason(status, error), client_request_id=self.client_request_id,
            cached_tokens=min(self.cached_tokens, self.prompt_tokens),
            # the ledger keeps their sum within completion_tokens (billing/ledger.py)
            accepted_prediction_tokens=self.accepted_prediction_tokens,
            rejected_prediction_tokens=self.rejected_prediction_tokens,
            # the ledger cuts both ids to billing/bounds.py's lengths
            batch_id=self.batch.batch_id if self.batch else None,
            custom_id=self.batch.custom_id if self.batch else None, end_user=self.end_user, tags=self.tags))
