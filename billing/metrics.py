"""Prometheus metrics of the ledger. Created unregistered: the gateway adds them to the registry its
`/metrics` renders (billing never imports the gateway)."""

from __future__ import annotations

from prometheus_client import Gauge

SHIPPING_BLOCKED = Gauge(
    "sluice_ledger_shipping_blocked",
    "Usage-log shippers of this process stopped at bytes they cannot read (1: new requests get 503 "
    "ledger_unavailable)",
    registry=None,
)
