"""What the request handlers share, opened once per app by its lifespan (`gateway.lifespan`). Handlers reach
it through dependency injection: a parameter `services: Services` (the billing routes take `ledger`, the
admin routes `auth`)."""

from __future__ import annotations

from dataclasses import dataclass

from auth import AuthService
from billing.ledger import Ledger
from gateway.adapters import AdapterRegistry
from gateway.config import Settings
from gateway.endpoints.service import Endpoints
from gateway.health_probe import GenerationProbe
from gateway.limits import Limiter
from gateway.routing.pool import Router


@dataclass
class Services:
    settings: Settings
    endpoints: Endpoints
    auth: AuthService
    limiter: Limiter
    ledger: Ledger | None  # None when `ledger_enabled` is off (benchmarks)
    started_at: float  # unix time, `created` of /v1/models
    probe: GenerationProbe  # GET /health_generate

    @property
    def adapters(self) -> AdapterRegistry:
        """Every endpoint's LoRA adapters."""
        return self.endpoints.adapters

    @property
    def router(self) -> Router:
        """Every endpoint's replica pool (the routes that read a worker's info or tokenizer)."""
        return self.endpoints.router
