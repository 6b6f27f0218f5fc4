"""Prometheus metrics of the ledger. Created unregistered: the gateway adds them to the registry its
`/metrics` renders (billing never imports the gateway)."""

from __future__ import annotations

from prometheus_client import Gauge

SHIPPING_BLOCKED = Gauge(
    "sluice_ledger_shipping_blocked",
    "1 while the usage log's shipper is stopped at bytes it cannot read (new requests get 503 ledger_unavailable)",
    registry=None,
)
