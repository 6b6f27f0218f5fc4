"""A worker call over activator leases: a replica that fails before anything reached the caller is ejected
for a while (passive health) and the call moves to another replica, at most `retries` times, invisibly. The
same rules for every kind of call: a generation's event stream (`stream_with_failover`) and a call with one
answer (`failover` over `relay.exchange`). After a generation's first event a lost worker is `WorkerLost`
(gateway/replicas/relay.py)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Generic, Protocol, TypeVar

import msgspec
import structlog

from common.protocol import Event, GenerateRequest
from gateway.replicas.pool import Replica
from gateway.replicas.relay import RetryElsewhere, attempt
from gateway.replicas.token_lines import TokenLines

log = structlog.get_logger(__name__)
RETRIES = 2
T = TypeVar("T")


class Leased(Protocol):
    """What failover needs of a lease: its replica and a way to give it back (the activator's `Lease`,
    gateway/endpoints/activator.py, the one lease API)."""

    replica: Replica

    def release(self) -> None: ...


def stream_with_failover(request: GenerateRequest, lease: Leased, *,
                         reacquire: Callable[[set[Replica]], Awaitable[Leased]],
                         ejection_s: float,
                         on_failure: Callable[[Replica, bool, bool], None] = lambda replica, ejected, retrying: None,
                         retries: int = RETRIES, raw_tokens: bool = False) -> FailoverStream[Event | TokenLines]:
    """Relay the request's events (`failover` of `relay.attempt`); `raw_tokens`: its token events as TokenLines."""
    body = msgspec.json.encode(request)
    return failover(lambda replica: attempt(replica, body, raw_tokens), lease, reacquire=reacquire,
                    ejection_s=ejection_s, on_failure=on_failure, retries=retries, call=request.request_id)


def failover(try_on: Callable[[Replica], AsyncIterator[T]], lease: Leased, *,
             reacquire: Callable[[set[Replica]], Awaitable[Leased]], ejection_s: float,
             on_failure: Callable[[Replica, bool, bool], None] = lambda replica, ejected, retrying: None,
             retries: int = RETRIES, call: str = "") -> FailoverStream[T]:
    """What `try_on(replica)` yields, tried on `lease`'s replica, then on others while a try fails before its
    first item (`RetryElsewhere`). Owns `lease` (and any lease it takes after a failure) and releases it when
    the stream ends, fails or is closed (started or not). `reacquire(tried)` leases another replica, avoiding
    those tried; `on_failure(replica, ejected, retrying)` hears of each try that failed; `call` names the call
    in the log."""
    return FailoverStream(_relay(try_on, lease, reacquire=reacquire, ejection_s=ejection_s,
                                 on_failure=on_failure, retries=retries, call=call), lease)


class FailoverStream(Generic[T]):
    """The items of `failover`. It owns its lease before its first item too: closing a stream that never
    started (a client gone before the response began, a fan-out whose other choice failed first) releases the
    lease, where a bare async generator that never ran would skip its `finally`."""

    def __init__(self, items: AsyncIterator[T], lease: Leased):
        self._items = items
        self._lease: Leased | None = lease  # until the relay runs and takes it over

    def __aiter__(self) -> FailoverStream[T]:
        return self

    def __anext__(self) -> Awaitable[T]:
        self._lease = None
        return anext(self._items)  # the relay's own awaitable: no coroutine of ours per event

    async def aclose(self) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.release()
        await self._items.aclose()


async def _relay(try_on: Callable[[Replica], AsyncIterator[T]], lease: Leased, *,
                 reacquire: Callable[[set[Replica]], Awaitable[Leased]],
                 ejection_s: float, on_failure: Callable[[Replica, bool, bool], None], retries: int,
                 call: str) -> AsyncIterator[T]:
    tried: set[Replica] = set()
    try:
        for tries_left in range(retries, -1, -1):
            try:
                async with aclosing(try_on(lease.replica)) as items:  # closes the worker's answer at once
                    async for item in items:
                        yield item
                lease.replica.served()
                return
            except RetryElsewhere as retry:
                failed = lease.replica
                tried.add(failed)
                if retry.replica_fault:
                    failed.eject(time.monotonic(), ejection_s)
                lease.release()
                lease = None
                on_failure(failed, retry.replica_fault, tries_left > 0)
                if not tries_left:
                    raise retry.error from retry
                log.warning("request_retried", request_id=call, replica=failed.url, reason=retry.error.message)
                lease = await reacquire(tried)
    finally:
        if lease is not None:
            lease.release()
