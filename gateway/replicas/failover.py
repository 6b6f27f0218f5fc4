"""A request's stream over activator leases: a replica that fails before the first event reached the
client is ejected for a while (passive health) and the request moves to another replica, at most
`retries` times, invisibly. After the first event a lost worker is `WorkerLost` (gateway/replicas/relay.py)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Protocol

import msgspec
import structlog

from common.protocol import Event, GenerateRequest
from gateway.replicas.pool import Replica
from gateway.replicas.relay import RetryElsewhere, attempt

log = structlog.get_logger(__name__)
RETRIES = 2


class Leased(Protocol):
    """What failover needs of a lease: its replica (the activator's `Lease` is one)."""

    replica: Replica


def stream_with_failover(request: GenerateRequest, lease: Leased, *,
                         reacquire: Callable[[set[Replica]], Awaitable[Leased]],
                         release: Callable[[Leased], None],
                         ejection_s: float,
                         on_failure: Callable[[Replica, bool, bool], None] = lambda replica, ejected, retrying: None,
                         retries: int = RETRIES) -> FailoverStream:
    """Relay the request's events. Owns `lease` (and any lease it takes after a failure) and releases
    it when the stream ends, fails or is closed (started or not). `reacquire(tried)` leases another replica, avoiding
    those tried; `on_failure(replica, ejected, retrying)` hears of each attempt that failed before its
    first event."""
    return FailoverStream(_relay(request, lease, reacquire=reacquire, release=release, ejection_s=ejection_s,
                                 on_failure=on_failure, retries=retries), lease, release)


class FailoverStream:
    """The events of `stream_with_failover`. It owns its lease before its first event too: closing a stream
    that never started (a client gone before the response began, a fan-out whose other choice failed first)
    releases the lease, where a bare async generator that never ran would skip its `finally`."""

    def __init__(self, events: AsyncIterator[Event], lease: Leased, release: Callable[[Leased], None]):
        self._events = events
        self._lease: Leased | None = lease  # until the relay runs and takes it over
        self._release = release

    def __aiter__(self) -> FailoverStream:
        return self

    def __anext__(self) -> Awaitable[Event]:
        self._lease = None
        return anext(self._events)  # the relay's own awaitable: no coroutine of ours per event

    async def aclose(self) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            self._release(lease)
        await self._events.aclose()


async def _relay(request: GenerateRequest, lease: Leased, *, reacquire: Callable[[set[Replica]], Awaitable[Leased]],
                 release: Callable[[Leased], None], ejection_s: float,
                 on_failure: Callable[[Replica, bool, bool], None], retries: int) -> AsyncIterator[Event]:
    body = msgspec.json.encode(request)
    tried: set[Replica] = set()
    try:
        for tries_left in range(retries, -1, -1):
            try:
                async with aclosing(attempt(lease.replica, body)) as events:  # closes the worker stream at once
                    async for event in events:
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
