"""A request's stream over activator leases: a replica that fails before the first event reached the
client is ejected for a while (passive health) and the request moves to another replica, at most
`retries` times, invisibly. After the first event a lost worker is `WorkerLost` (gateway/proxy.py)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

import msgspec
import structlog

from common.protocol import Event, GenerateRequest
from gateway.proxy import RetryElsewhere, attempt
from gateway.routing.pool import Replica

log = structlog.get_logger(__name__)
RETRIES = 2


class Leased(Protocol):
    """What failover needs of a lease: its replica (the activator's `Lease` is one)."""

    replica: Replica


async def stream_with_failover(request: GenerateRequest, lease: Leased, *,
                               reacquire: Callable[[set[Replica]], Awaitable[Leased]],
                               release: Callable[[Leased], None],
                               ejection_s: float,
                               on_failure: Callable[[Replica, bool, bool], None] = lambda replica, ejected, retrying: None,
                               retries: int = RETRIES) -> AsyncIterator[Event]:
    """Relay the request's events. Owns `lease` (and any lease it takes after a failure) and releases
    it when the stream ends, fails or is closed. `reacquire(tried)` leases another replica, avoiding
    those tried; `on_failure(replica, ejected, retrying)` hears of each attempt that failed before its
    first event."""
    body = msgspec.json.encode(request)
    tried: set[Replica] = set()
    try:
        for tries_left in range(retries, -1, -1):
            try:
                async for event in attempt(lease.replica, body):
                    yield event
                lease.replica.served()
                return
            except RetryElsewhere as retry:
                failed = lease.replica
                tried.add(failed)
                if retry.replica_fault:
                    failed.eject(time.monotonic(), ejection_s)
                release(lease)
                lease = None
                on_failure(failed, retry.replica_fault, tries_left > 0)
                if not tries_left:
                    raise retry.error from retry
                log.warning("request_retried", request_id=request.request_id, replica=failed.url,
                            reason=retry.error.message)
                lease = await reacquire(tried)
    finally:
        if lease is not None:
            release(lease)
