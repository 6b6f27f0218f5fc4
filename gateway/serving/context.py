"""`RequestContext`: one generation request as it moves through the pipeline's stages (`gateway.serving.pipeline`:
parse -> authorize -> admit -> lease -> relay -> settle). Each stage fills in its part, in that order.

Settlement has one door, `settle`: the only call of `Accounting.finish` (limits settled, metrics, the log line's
fields, the ledger record), and it runs once, whatever calls it first. The pipeline settles where the answer
depends on it (a collected answer and a stream's end are never served unbilled; an error is rendered with the
status the ledger records). The request scope (`gateway.serving.request_scope`) closes the context when the
response is over (`close`): it hands back any lease no worker stream took over, closes the workers' events
that no response read to the end, and settles a request that ended without an outcome: `cancelled` (a client
gone, a task cancelled), or `error` when a fault escaped the app.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field

from litestar import Request

from auth import Principal
from common.protocol import AdapterRef
from gateway.endpoints.activator import Lease
from gateway.endpoints.controller import EndpointController
from gateway.errors import SluiceError
from gateway.serving.accounting import Accounting
from gateway.serving.dialect import Dialect, Meta, Parsed
from gateway.serving.request_scope import cancelled, client_request_id_of, enter, outcome_of, request_id_of
from gateway.serving.services import Services


@dataclass(eq=False, slots=True)
class RequestContext:
    request: Request
    services: Services
    dialect: Dialect
    route: str  # the path it came by (the ledger's `route`)
    request_id: str  # the ledger's idempotency key (gateway.serving.request_scope)
    principal: Principal  # the caller, authenticated before the pipeline began
    accounting: Accounting
    parsed: Parsed | None = None  # parse: one GenerateRequest per prompt
    endpoint: EndpointController | None = None  # authorize: the endpoint the body names
    adapter: AdapterRef | None = None  # authorize: the LoRA adapter it names
    tenant: str = ""  # admit: the billed team as workers see it (pipeline.tenant_of)
    deadline: float = math.inf  # admit: when a wait for a replica gives up (time.monotonic)
    meta: Meta | None = None  # admit: the reply's id, time and model
    leases: list[Lease] = field(default_factory=list)  # lease: one per GenerateRequest once leased
    reading: AsyncIterator | None = None  # relay: what a streamed response reads (the wait, the workers' events)
    status: str | None = None  # settle: the outcome recorded; None until settled

    @classmethod
    def open(cls, request: Request, services: Services, dialect: Dialect, route: str) -> RequestContext:
        """The context of an authenticated request (`request.user`), entered into its request scope."""
        principal: Principal = request.user
        request_id = request_id_of(request)
        accounting = Accounting(services, principal, request_id, dialect.name, route, outcome_of(request),
                                client_request_id_of(request))
        context = cls(request, services, dialect, route, request_id, principal, accounting)
        enter(request, context)
        return context

    @property
    def relay_timeout_s(self) -> float:
        """How long the relay may run in all, from its first read of worker events (settings.request_timeout_s)."""
        return self.services.settings.request_timeout_s

    async def settle(self, status: str, error: SluiceError | None = None) -> None:
        """Settle the request as `status` (ok, error, rejected, cancelled), once: later calls do nothing."""
        if self.status is not None:
            return
        self.status = status
        await self.accounting.finish(status, error)

    def discard(self) -> None:
        """A canned answer (MonsterAPI's mock_response): it reaches no worker and settles nothing, not even later."""
        self.status = "discarded"

    def release_leases(self) -> None:
        """Hand back every lease: a no-op for one whose worker stream already released it."""
        for lease in self.leases:
            lease.release()

    def close(self, ended_by: BaseException | None) -> Awaitable[None] | None:
        """The request is over (`ended_by`: what escaped the app, if anything). What is left to await, if
        anything: None in the usual case, where the pipeline settled and its response closed what it read."""
        self.release_leases()
        if self.reading is None and self.status is not None:
            return None
        return self._close(ended_by)

    async def _close(self, ended_by: BaseException | None) -> None:
        if self.reading is not None:  # a stream whose response never began (or never finished) reading it
            reading, self.reading = self.reading, None
            await reading.aclose()
            self.release_leases()  # any a wait took as it closed
        await self.settle("cancelled" if cancelled(ended_by) else "error")
