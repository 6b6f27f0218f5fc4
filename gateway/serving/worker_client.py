"""The one road to a model's workers: every worker call (a generation's stream, tokenize, detokenize, a chat
template's token count, the `/health_generate` probe, a batch line) takes an activator lease on the endpoint
(`endpoint.activator`: the one lease API, gateway/endpoints/activator.py), goes over the replica's one client
(gateway/replicas/transport.py), moves to another replica by failover's rules when a replica fails before
answering, and gives the lease back.

The lease is what makes a call count: a call that finds no ready replica waits in the endpoint's queue
(which wakes a scaled-to-zero endpoint: the controller is told of the demand), and a call on a replica is
one of its `in_flight` (what the activator releases queued requests by and the autoscaler scales on). A call
may instead take only a replica free now (`deadline=None`): it then never waits, never counts as demand, and
fails with a 503 when the endpoint has no ready replica (the public health probe: a load balancer's poll must
neither keep an endpoint awake nor start one).

It sits above `gateway.endpoints` (leases, the endpoint's settings and metrics) and `gateway.replicas` (the
transport, one try on a replica, failover), which know nothing of each other's calls.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing

from common.protocol import Event, GenerateRequest
from gateway.endpoints import metrics
from gateway.endpoints.activator import Lease
from gateway.endpoints.controller import EndpointController
from gateway.endpoints.service import Endpoints
from gateway.replicas.failover import failover, stream_with_failover
from gateway.replicas.pool import Replica
from gateway.replicas.relay import exchange
from gateway.replicas.token_lines import TokenLines


class WorkerClient:
    """Calls to the workers of `endpoints`' endpoints (one per gateway: `Services.workers`)."""

    def __init__(self, endpoints: Endpoints):
        self.endpoints = endpoints

    def stream(self, endpoint: EndpointController, lease: Lease, request: GenerateRequest,
               deadline: float | None, raw_tokens: bool = False) -> AsyncIterator[Event | TokenLines]:
        """A generation's events on `lease` (taken by the caller, who may wait its own way: the pipeline sends
        SSE keep-alives). Owns the lease from here and releases it when the stream ends or is closed; retries on
        another replica (leased until `deadline`, as `lease`) at most twice while nothing was relayed; after the
        first event a lost worker is WorkerLost. `raw_tokens`: its token events come undecoded, as TokenLines
        (a collected answer's: gateway/replicas/token_lines.py)."""
        return stream_with_failover(request, lease, reacquire=_reacquire(endpoint, deadline, request.tenant),
                                    ejection_s=self.endpoints.settings.ejection_seconds,
                                    on_failure=_counter(endpoint), raw_tokens=raw_tokens)

    async def call(self, endpoint: EndpointController, lease: Lease, path: str, body: bytes,
                   deadline: float | None) -> bytes:
        """`POST path` with the JSON `body` on `lease` (taken by the caller, who may wait its own way: a tokenizer
        call gives up its wait when its client leaves): the worker's 200 answer. Owns the lease from here and
        releases it when the call ends; retries on another replica (leased until `deadline`, as `lease`) by
        failover's rules. The worker's refusal is the gateway's error (a validation refusal a ValidationFailed
        naming the worker's field)."""
        answers = failover(lambda replica: exchange(replica, path, body), lease,
                           reacquire=_reacquire(endpoint, deadline, lease.tenant),
                           ejection_s=self.endpoints.settings.ejection_seconds,
                           on_failure=_counter(endpoint), call=path)
        async with aclosing(answers):  # a caller cancelled before the first try still gives the lease back
            # read to the end, not left at the answer: the replica is marked as having served, the lease released
            answered = [answer async for answer in answers]
        return answered[0]


def _reacquire(endpoint: EndpointController, deadline: float | None,
               tenant: str) -> Callable[[set[Replica]], Awaitable[Lease]]:
    """Another replica after a failed try, avoiding those `tried`, by the first lease's rules."""
    return lambda tried: endpoint.activator.acquire(deadline, tried, tenant)


def _counter(endpoint: EndpointController) -> Callable[[Replica, bool, bool], None]:
    """Counts a failed try in the endpoint's metrics: an ejection, a retry."""
    def failed(replica: Replica, ejected: bool, retrying: bool) -> None:
        if ejected:
            metrics.EJECTIONS.labels(endpoint.name).inc()
        if retrying:
            metrics.RETRIES.labels(endpoint.name).inc()

    return failed
