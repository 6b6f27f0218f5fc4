"""Prometheus metrics of the limiter; registered once per process in the default registry."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

BACKEND_ERRORS = Counter(
    "sluice_limiter_backend_errors_total",
    "Limiter calls that could not reach the shared backend (Redis), by operation and what was done",
    ["op", "outcome"],  # op: admit|settle; outcome: local|fail_open|fail_closed|dropped
)
BACKEND_UP = Gauge("sluice_limiter_backend_up", "1 while the limiter's shared backend answers, 0 during an outage")
REJECTIONS = Counter("sluice_limiter_rejections_total", "Requests refused by the limiter, by kind", ["kind"])
