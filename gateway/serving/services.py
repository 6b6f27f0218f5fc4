"""What the request handlers share, opened once per app by its lifespan (`gateway.edge.lifespan`). Handlers reach
it through dependency injection: a parameter `services: Services` (the billing routes take `ledger`, the
admin routes `auth`)."""

from __future__ import annotations

from dataclasses import dataclass

from auth import AuthService, Principal
from billing.ledger import Ledger
from gateway.config import Settings
from gateway.endpoints.adapters import AdapterRegistry
from gateway.endpoints.service import Endpoints
from gateway.limits import Limiter
from gateway.replicas.pool import ReplicaRouter
from gateway.serving.budget_gate import BudgetGate
from gateway.serving.health_alerts import HealthWatch
from gateway.serving.health_probe import GenerationProbe
from gateway.serving.model_aliases import endpoint_named
from gateway.serving.spending import SpendReader
from gateway.serving.worker_client import WorkerClient


@dataclass
class Services:
    settings: Settings
    endpoints: Endpoints
    auth: AuthService
    limiter: Limiter
    ledger: Ledger | None  # None only in bench/ledger_gateway.py's baseline (SLUICE_BENCH_NO_LEDGER)
    started_at: float  # unix time, `created` of /v1/models
    workers: WorkerClient  # every call to a worker goes through it
    probe: GenerationProbe  # GET /health_generate
    budgets: BudgetGate  # every budget, in tokens and in money: reserved at admission, settled at the end
    spending: SpendReader | None = None  # the views' figures of budgets (None without a ledger to read)
    health: HealthWatch | None = None  # the teams' alerts on error rate and latency

    @property
    def adapters(self) -> AdapterRegistry:
        """Every endpoint's LoRA adapters."""
        return self.endpoints.adapters

    def described_model(self, principal: Principal | None) -> str:
        """The model the info route of a one-model API (TGI's /info, SGLang's /get_model_info) describes: the first
        endpoint the caller may see (404 when none); a key's allow-list applies as on any call (403)."""
        return self.callable_model(principal, None)

    def callable_model(self, principal: Principal | None, model: str | None) -> str:
        """The endpoint `model` names (unset or an alias: the first one the caller may see), by generation's rule:
        another team's private endpoint is a 404, one the sent key's allow-list leaves out a 403."""
        name = endpoint_named(self.endpoints, model, principal).name
        if principal is not None:
            self.auth.check_model(principal, name)
        return name

    @property
    def router(self) -> ReplicaRouter:
        """Every endpoint's replica pool (the routes that read a worker's polled info)."""
        return self.endpoints.router
