"""Prometheus metrics of the gateway: requests, tokens, latencies (served by `gateway.edge.metrics_route`).

One registry per process, fed when each request's accounting finishes (`gateway.serving.accounting`), whatever path
it took. No label carries what a client wrote: a model that names no endpoint is `unknown` (endpoint names
come from the operator), so the series stay bounded however many names callers invent.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.metrics import MetricWrapperBase

from billing.metrics import SHIPPING_BLOCKED

REGISTRY = CollectorRegistry()
REGISTRY.register(SHIPPING_BLOCKED)
LABELS = ("dialect", "route", "model", "status")
UNKNOWN = "unknown"  # the model label of a request whose model names no endpoint

REQUESTS = Counter("sluice_requests", "Generation requests by outcome", LABELS, registry=REGISTRY)
PROMPT_TOKENS = Counter("sluice_prompt_tokens", "Prompt tokens processed", ("dialect", "model"), registry=REGISTRY)
GENERATED_TOKENS = Counter("sluice_generated_tokens", "Tokens returned to clients", ("dialect", "model"),
                           registry=REGISTRY)
LATENCY = Histogram("sluice_request_duration_seconds", "Request latency, first byte to last",
                    ("dialect", "route", "model"), registry=REGISTRY,
                    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
FIRST_TOKEN = Histogram("sluice_time_to_first_token_seconds", "Time to the first generated token",
                        ("dialect", "model"), registry=REGISTRY,
                        buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
PER_TOKEN = Histogram("sluice_time_per_token_seconds", "Mean time per generated token of a request",
                      ("dialect", "model"), registry=REGISTRY,
                      buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1))
HEALTH_PROBES = Counter("sluice_health_generate_probes", "Generations run for GET /health_generate, by outcome",
                        ("outcome",), registry=REGISTRY)


_children: dict[tuple, Any] = {}  # (metric, label values) -> its child: `labels()` validates and locks each call


def _child(metric: MetricWrapperBase, *values: str) -> Any:
    child = _children.get((metric, values))
    if child is None:
        child = _children[(metric, values)] = metric.labels(*values)
    return child


def observe(accounting, status: str) -> None:
    """Record one finished request from its `gateway.serving.accounting.Accounting`."""
    model = accounting.model if accounting.model in accounting.services.endpoints.controllers else UNKNOWN
    dialect, route = accounting.dialect, accounting.route
    elapsed = time.perf_counter() - accounting.started
    _child(REQUESTS, dialect, route, model, status).inc()
    _child(LATENCY, dialect, route, model).observe(elapsed)
    _child(PROMPT_TOKENS, dialect, model).inc(accounting.prompt_tokens)
    _child(GENERATED_TOKENS, dialect, model).inc(accounting.completion_tokens)
    if accounting.first_token is not None:
        _child(FIRST_TOKEN, dialect, model).observe(accounting.first_token - accounting.started)
        if accounting.completion_tokens:
            _child(PER_TOKEN, dialect, model).observe(elapsed / accounting.completion_tokens)

