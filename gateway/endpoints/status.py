"""What an endpoint looks like from outside: its state and replica counts, for `/health` detail,
`GET /v1/endpoints`, the admin API and the metrics."""

from __future__ import annotations

from typing import Literal

import msgspec

from gateway.endpoints.spec import EndpointSpec

State = Literal["scaled_to_zero", "starting", "ready", "draining", "failed"]


class ReplicaCounts(msgspec.Struct):
    ready: int
    starting: int
    draining: int


class EndpointStatus(msgspec.Struct):
    name: str
    state: State
    reason: str | None  # why it failed, a fixed phrase a tenant may see (weights failed to load, crash loop)
    replicas: ReplicaCounts
    desired_replicas: int
    in_flight: int
    waiting: int  # requests queued in the activator
    spec: EndpointSpec
    detail: str | None = None  # the reason in full (a worker's last line: paths, exceptions): operator views only

    @property
    def healthy(self) -> bool:
        """Counts toward `/health`: ready, or allowed to sleep (min_replicas 0) and not failed."""
        if self.state == "ready":
            return True
        return self.spec.min_replicas == 0 and self.state in ("scaled_to_zero", "starting")
