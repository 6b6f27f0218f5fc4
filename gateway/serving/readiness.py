"""Readiness: the one rule behind `GET /health` and every dialect's health route (DataCrunch's
`/v1/completions/health`). Ready once every endpoint is ready or may sleep (min_replicas 0: it wakes on demand)
and has not failed, and the rate limiter is not refusing every request (its `closed` outage policy). Which
endpoints are not ready (private ones among them) is the operator's to know: `reason(admin=False)` names none."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.endpoints.status import EndpointStatus
from gateway.serving.services import Services


@dataclass(frozen=True)
class Readiness:
    states: list[EndpointStatus]
    limiter: str | None  # the outage policy in force while the limiter's shared backend is away, else None

    @property
    def unready(self) -> list[EndpointStatus]:
        return [status for status in self.states if not status.healthy]

    @property
    def ready(self) -> bool:
        return not self.unready and self.limiter != "closed"

    def reason(self, admin: bool) -> str | None:
        """Why it is not ready (or degraded); endpoint names and their details only for an admin."""
        parts = []
        if unready := self.unready:
            parts.append("no ready worker for: " + ", ".join(
                f"{s.name} ({s.state}{': ' + s.detail if s.detail else ''})" for s in unready)
                if admin else "no ready worker for some endpoints")
        if self.limiter:
            parts.append(f"rate limiter backend down (policy {self.limiter})")
        return "; ".join(parts) or None


def readiness(services: Services) -> Readiness:
    return Readiness(services.endpoints.states(), services.limiter.degraded)
