"""What the Redis limiter does while its server cannot be reached (README.md, "Outage").

Three policies (`limiter_on_outage`):
- `local` (the default): each gateway admits through an in-process limiter of its own, with every rate and
  concurrency limit divided by the number of gateways that may share the limits (`limiter_outage_gateways`), so
  the fleet together stays within each limit (budgets are not the limiter's: the budget book, budgets.py, fails
  closed while its Redis is away);
- `closed`: every admission is refused (503 `limiter_unavailable`);
- `open`: every admission goes through unlimited.

While the server is down, admissions skip it but for one probe every `PROBE_S` (a server that does not answer
would otherwise cost every request the full timeout). The first failure logs `limiter_backend_down`, then one
`limiter_backend_still_down` line per `REPORT_S` with what was done meanwhile (never a traceback per call), and
the first success `limiter_backend_up`; the metric `sluice_limiter_backend_up` is 0 meanwhile.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Literal

import structlog

from gateway.limits.clock import Clock
from gateway.limits.memory import InProcessLimiter
from gateway.limits.metrics import BACKEND_ERRORS, BACKEND_UP
from gateway.limits.model import LimiterUnavailable, LimitExceeded, Ticket
from gateway.limits.scope import LimitScope

log = structlog.get_logger("sluice.limits")

OutagePolicy = Literal["local", "closed", "open"]
PROBE_S = 1.0  # while down, one admission per this long tries the server; the others go to the policy at once
REPORT_S = 60.0  # while down, one log line per this long


def local_share(scope: LimitScope, gateways: int) -> LimitScope:
    """This gateway's share of the scope's rate and concurrency limits (at least 1 of each)."""
    def share(limit: int | None) -> int | None:
        return None if limit is None else max(1, limit // gateways)
    return LimitScope(scope.id, rpm=share(scope.rpm), tpm=share(scope.tpm),
                      max_concurrency=share(scope.max_concurrency))


class Outage:
    def __init__(self, policy: OutagePolicy, *, gateways: int = 1, clock: Clock | None = None,
                 concurrency_lease: float = 900.0, concurrency_retry: float = 1.0):
        if policy not in ("local", "closed", "open"):
            raise ValueError(f"unknown limiter outage policy {policy!r}: local, closed or open")
        if gateways < 1:
            raise ValueError("the gateways sharing the limits must be at least 1")
        self.policy = policy
        self.gateways = gateways
        self._local = (InProcessLimiter(clock, concurrency_lease=concurrency_lease,
                                        concurrency_retry=concurrency_retry) if policy == "local" else None)
        self._local_tickets: set[str] = set()  # ids of the tickets the local limiter admitted, until settled
        self.up = True
        self._next_probe = 0.0
        self._next_report = 0.0
        self._done: Counter[str] = Counter()  # what was done since the last report
        BACKEND_UP.set(1)

    def skip_backend(self) -> bool:
        """Down, and not yet time to try the server again: decide without it."""
        if self.up:
            return False
        now = time.monotonic()
        if now >= self._next_probe:
            self._next_probe = now + PROBE_S
            return False
        return True

    async def admit(self, scopes: list[LimitScope], tokens: int, sequences: int, ticket_id: str,
                    error: BaseException | None) -> Ticket:
        """The admission the policy makes without the server (LimitExceeded and LimiterUnavailable as usual);
        `error`: what the server's call raised, None when it was not asked (a probe failed less than PROBE_S ago)."""
        if self.policy == "open":
            self._count("admit", "fail_open")
            return Ticket(ticket_id, tokens, degraded=True)
        if self.policy == "closed":
            self._count("admit", "fail_closed")
            why = "the server is down" if error is None else error.__class__.__name__
            raise LimiterUnavailable(f"rate limiter backend unavailable: {why}") from error
        self._count("admit", "local")
        try:
            ticket = await self._local.admit([local_share(s, self.gateways) for s in scopes], tokens, sequences)
        except LimitExceeded as refusal:
            if refusal.kind != "never_fits":
                raise
            # it fits the whole limit (checked before the server was asked), only not this gateway's share of it
            raise LimiterUnavailable("rate limiter backend unavailable: the request exceeds this gateway's "
                                     "share of the limits") from refusal
        self._local_tickets.add(ticket.id)
        return ticket

    def owns(self, ticket: Ticket) -> bool:
        return ticket.id in self._local_tickets

    async def settle(self, ticket: Ticket, used_tokens: int) -> None:
        self._local_tickets.discard(ticket.id)
        await self._local.settle(ticket, used_tokens)

    def dropped_settle(self) -> None:
        self._count("settle", "dropped")

    def went_down(self, op: str, error: str) -> None:
        now = time.monotonic()
        if self.up:
            self.up = False
            self._next_probe, self._next_report = now + PROBE_S, now + REPORT_S
            self._done.clear()
            BACKEND_UP.set(0)
            log.warning("limiter_backend_down", op=op, error=error, policy=self.policy,
                        fail_open=self.policy == "open")
        elif now >= self._next_report:
            self._next_report = now + REPORT_S
            log.warning("limiter_backend_still_down", error=error, policy=self.policy, **self._summary())
            self._done.clear()

    def recovered(self) -> None:
        if not self.up:
            self.up = True
            BACKEND_UP.set(1)
            log.info("limiter_backend_up", **self._summary())
            self._done.clear()

    def _summary(self) -> dict[str, int]:
        return {key.replace(":", "_"): count for key, count in sorted(self._done.items())}

    def _count(self, op: str, outcome: str) -> None:
        BACKEND_ERRORS.labels(op, outcome).inc()
        self._done[f"{op}:{outcome}"] += 1

    async def close(self) -> None:
        if self._local is not None:
            await self._local.close()
