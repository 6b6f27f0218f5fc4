"""The workers' engine series on the gateway's registry (`GET /metrics`): `sluice_worker_*`, one per ready replica,
labelled with its endpoint and replica.

They come from the `/load` answer each replica's controller already polls (every `health_interval_seconds` when
ready, gateway/endpoints/controller.py), read when Prometheus scrapes: a scrape makes no call to a worker, so a
replica that is down or slow can neither hang nor fail `/metrics`; it is left out (its last answer is stale).
The counters are the worker's own, since it started: a restarted worker starts them over, which Prometheus' rate()
reads as a counter reset. Labels are operator names (endpoint, replica), never a tenant's.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.metrics import REGISTRY

# pool.py's ReplicaRouter and Replica, read by attribute: pool.py registers its routers here, and importing it
# back would be a cycle
Router = Any
Replica = Any

LABELS = ["endpoint", "replica"]


class WorkerSeries(Collector):
    """Reads the pools of every live router (one per gateway app; tests run several in one process)."""

    def __init__(self) -> None:
        self.routers: weakref.WeakSet[Router] = weakref.WeakSet()  # a closed app's router goes with it

    def watch(self, router: Router) -> None:
        self.routers.add(router)

    def forget(self, router: Router) -> None:
        self.routers.discard(router)

    def collect(self) -> Iterator[Metric]:
        waiting = GaugeMetricFamily("sluice_worker_requests_waiting", "Requests queued in the worker's engine",
                                    labels=LABELS)
        running = GaugeMetricFamily("sluice_worker_rows_running", "Rows (sequences) decoding in the worker's batch",
                                    labels=LABELS)
        rows = GaugeMetricFamily("sluice_worker_max_rows", "Rows the worker's batch holds at most", labels=LABELS)
        kv = GaugeMetricFamily("sluice_worker_kv_cache_use", "KV positions held over what the cache may hold (0..1)",
                               labels=LABELS)
        steps = CounterMetricFamily("sluice_worker_steps", "Decode steps the engine ran", labels=LABELS)
        seconds = CounterMetricFamily("sluice_worker_step_seconds", "Time of those steps, summed", labels=LABELS)
        prompt = CounterMetricFamily("sluice_worker_prompt_tokens", "Prompt tokens of the requests it finished",
                                     labels=LABELS)
        generated = CounterMetricFamily("sluice_worker_generated_tokens",
                                        "Tokens it generated for the requests it finished", labels=LABELS)
        for endpoint, replica in self._ready():
            load, labels = replica.load, [endpoint, replica_label(replica)]
            assert load is not None  # _ready's
            waiting.add_metric(labels, load.queued)
            running.add_metric(labels, load.running_rows)
            rows.add_metric(labels, load.max_rows)
            kv.add_metric(labels, load.engine.kv_cache_use)
            steps.add_metric(labels, load.engine.steps)
            seconds.add_metric(labels, load.engine.step_seconds)
            prompt.add_metric(labels, load.engine.prompt_tokens)
            generated.add_metric(labels, load.engine.generated_tokens)
        yield from (waiting, running, rows, kv, steps, seconds, prompt, generated)

    def _ready(self) -> Iterator[tuple[str, Replica]]:
        for router in list(self.routers):
            for pool in list(router.pools.values()):
                for replica in list(pool.replicas):
                    if replica.healthy and replica.load is not None:
                        yield pool.name, replica


def replica_label(replica: Replica) -> str:
    """The provisioner's name for it, else the worker's id, else its URL: all the operator's."""
    return replica.replica_id or (replica.load.worker_id if replica.load else "") or replica.url


WORKERS = WorkerSeries()
REGISTRY.register(WORKERS)
