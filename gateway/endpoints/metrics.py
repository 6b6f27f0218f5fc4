"""Prometheus metrics of the endpoints, on the gateway's registry (`GET /metrics`)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from gateway.metrics import REGISTRY

STATES = ("scaled_to_zero", "starting", "ready", "draining", "failed")
PHASES = ("starting", "ready", "draining")
REFUSALS = ("queue_full", "scale_up_timeout", "endpoint_failed", "endpoint_draining")

STATE = Gauge("sluice_endpoint_state", "1 for the endpoint's current state, 0 for the others",
              ("endpoint", "state"), registry=REGISTRY)
REPLICAS = Gauge("sluice_endpoint_replicas", "Replicas by phase", ("endpoint", "phase"), registry=REGISTRY)
DESIRED = Gauge("sluice_endpoint_desired_replicas", "Replicas the autoscaler wants", ("endpoint",),
                registry=REGISTRY)
QUEUE_DEPTH = Gauge("sluice_endpoint_queue_depth", "Requests waiting in the activator for a replica",
                    ("endpoint",), registry=REGISTRY)
COLD_START = Histogram("sluice_endpoint_cold_start_seconds", "Time a request waited in the activator",
                       ("endpoint",), registry=REGISTRY,
                       buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120, 300))
REFUSED = Counter("sluice_endpoint_refused", "Requests the activator refused (queue full, wait over, failed)",
                  ("endpoint", "reason"), registry=REGISTRY)
RETRIES = Counter("sluice_endpoint_retries", "Requests retried on another replica before their first byte",
                  ("endpoint",), registry=REGISTRY)
EJECTIONS = Counter("sluice_endpoint_ejections", "Replicas taken out of rotation after a failed request",
                    ("endpoint",), registry=REGISTRY)
STARTS = Counter("sluice_endpoint_replica_starts", "Replicas started", ("endpoint",), registry=REGISTRY)


def set_state(endpoint: str, state: str) -> None:
    for name in STATES:
        STATE.labels(endpoint, name).set(1 if name == state else 0)


def forget(endpoint: str) -> None:
    """A deleted endpoint leaves no series behind."""
    series = [(STATE, (endpoint, state)) for state in STATES]
    series += [(REPLICAS, (endpoint, phase)) for phase in PHASES]
    series += [(REFUSED, (endpoint, reason)) for reason in REFUSALS]
    series += [(metric, (endpoint,)) for metric in (DESIRED, QUEUE_DEPTH, COLD_START, RETRIES, EJECTIONS, STARTS)]
    for metric, labels in series:
        try:
            metric.remove(*labels)
        except KeyError:  # never observed
            pass
