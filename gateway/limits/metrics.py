"""Prometheus metrics of the limiter, in the gateway's one registry (`gateway.metrics.REGISTRY`), which `/metrics`
renders: a series in prometheus_client's default registry would never be scraped."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from gateway.metrics import REGISTRY

BACKEND_ERRORS = Counter(
    "sluice_limiter_backend_errors_total",
    "Limiter calls that could not reach the shared backend (Redis), by operation and what was done",
    ["op", "outcome"],  # op: admit|settle; outcome: local|fail_open|fail_closed|dropped
    registry=REGISTRY,
)
BACKEND_UP = Gauge("sluice_limiter_backend_up", "1 while the limiter's shared backend answers, 0 during an outage",
                   registry=REGISTRY)
REJECTIONS = Counter("sluice_limiter_rejections_total", "Requests refused by the limiter, by kind", ["kind"],
                     registry=REGISTRY)
