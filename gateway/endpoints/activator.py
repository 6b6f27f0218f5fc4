"""The activator: requests that find no replica to take them wait here, in the endpoint's FIFO queue.

- A request goes straight to the least-loaded available replica with room (fewer in flight than its
  capacity) when nobody is queued before it.
  Otherwise it joins the back of the queue, which is bounded by the endpoint's `max_waiting`, and the
  endpoint's controller is told once per request that demand grew (it samples demand, the autoscaler
  decides: one scale-up however many requests arrive together).
- Queued requests are released in tenants' fair turns: first the waiter whose tenant (the billed team) holds
  the fewest leases of this endpoint plus waiters before it; among equals the tenant served least recently,
  then the oldest. One team's many prompts (a lease each) cannot hold another team's first one behind them,
  and teams that wait together alternate. While another replica is still starting, each goes onto a
  replica that has fewer than `ceil(target_concurrency x burst_factor)` requests in flight: a replica that
  just became ready gets that many at once, the rest wait for the others (no stampede onto the first
  replica). Once none is starting, a replica takes them up to its capacity (its rows and its worker's
  queue) at once, as a warm one takes a burst: held back in the gateway, each would reach the worker one
  step after a row freed, instead of joining the batch in that step.
- The wait ends at the request's deadline (the earliest of the endpoint's `max_wait_seconds`, the
  request's own deadline and its X-Scale-Up-Timeout); queue full, wait over, or a failed endpoint end
  it with `EndpointUnavailable`, which carries the endpoint's state and a Retry-After. A failed
  endpoint answers at once.
- A waiter that is cancelled (its client went away) leaves the queue; a replica handed to it in the
  same instant is handed back.

Each released request holds a `Lease` on its replica (one count of the replica's `in_flight`) until
`release`: that count is how the activator and the autoscaler see load. This is the one lease API of the
gateway: every worker call (a generation, a tokenizer call, the health probe, a batch line) takes its replica
here and gives it back with `lease.release()` (once; again is a no-op) or by leaving `async with
activator.leased(...)`, which releases on error and cancellation too.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from gateway.endpoints import metrics
from gateway.endpoints.errors import EndpointUnavailable
from gateway.errors import Unavailable
from gateway.replicas.pool import ModelPool, Replica

_REMEMBERED = 10_000  # tenants whose last turn is kept; beyond, the oldest memories are dropped


@dataclass(eq=False)
class Lease:
    """One request's hold on one replica, from acquisition until `release` (made only by its `Activator`)."""

    replica: Replica
    waited_s: float  # time spent queued (the ledger's cold start); 0 when a replica was free at once
    activator: Activator = field(repr=False)
    tenant: str = ""  # whose turn it was (fair release among tenants)
    released: bool = False

    @property
    def cold_start_ms(self) -> float:
        return self.waited_s * 1000

    def release(self) -> None:
        """Give the replica back (once: a lease released twice counts once)."""
        self.activator.release(self)


@dataclass(frozen=True)
class StillWaiting:
    """Yielded every keep-alive interval while a request waits (a streaming reply sends a comment)."""

    waited_s: float


@dataclass(frozen=True)
class Availability:
    """What the activator needs to know of its endpoint at the moment a request arrives or times out."""

    state: str  # scaled_to_zero | starting | ready | draining | failed
    reason: str | None  # why it failed
    retry_after: float  # seconds a refused client should wait before trying again


@dataclass(eq=False)
class _Waiter:
    enqueued: float
    tenant: str
    future: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class Activator:
    def __init__(self, name: str, pool: ModelPool, availability: Callable[[], Availability],
                 on_demand: Callable[[], None], *, max_waiting: int, release_limit: int,
                 clock: Callable[[], float] = time.monotonic):
        self.name = name
        self.pool = pool
        self.availability = availability
        self.on_demand = on_demand
        self.max_waiting = max_waiting
        self.release_limit = release_limit  # requests in flight per replica while others are starting
        self.capacity = release_limit  # requests in flight per replica once none is starting
        self.starting = True  # another replica is on its way (the controller says at each tick)
        self.clock = clock
        self.turned_away = 0  # refused for a full queue since the controller last sampled demand
        self._queue: deque[_Waiter] = deque()
        self._held: Counter[str] = Counter()  # leases in flight per tenant
        self._served = itertools.count(1)
        self._last: dict[str, int] = {}  # tenant -> when it was last given a lease, oldest first

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def configure(self, *, max_waiting: int, target_concurrency: float, burst_factor: float,
                  capacity: int = 0) -> None:
        """Apply the endpoint's (possibly patched) bounds. `capacity`: the requests one replica takes at
        once (its worker's rows and queue; never below the burst limit)."""
        self.max_waiting = max_waiting
        self.release_limit = max(1, math.ceil(target_concurrency * burst_factor))
        self.capacity = max(self.release_limit, capacity)
        self.pump()

    def replicas_starting(self, starting: bool) -> None:
        """Whether another replica is on its way: the queue is then spread at the burst limit, else released
        up to each replica's capacity."""
        self.starting = starting
        self.pump()

    async def acquire(self, deadline: float | None, avoid: Collection[Replica] = (), tenant: str = "") -> Lease:
        """A lease on a replica, waiting in the queue until `deadline` (on `clock`) if none is free.
        `avoid`: replicas this request already failed on, taken only when no other is free. `deadline=None`: only
        a replica free now, else Unavailable at once (nothing waits, nothing counts as demand: the public health
        probe, which must neither keep an endpoint awake nor start one)."""
        if deadline is None:
            lease = self.take_free(avoid, tenant)
            if lease is None:
                raise Unavailable(f"the model {self.name!r} has no ready worker; retry shortly")
            return lease
        waiting = self.wait(deadline, keepalive_s=math.inf, avoid=avoid, tenant=tenant)
        try:
            async for step in waiting:
                if isinstance(step, Lease):
                    return step
        finally:
            await waiting.aclose()
        raise AssertionError("the activator's wait ended without a lease or an error")

    @asynccontextmanager
    async def leased(self, deadline: float | None, avoid: Collection[Replica] = (),
                     tenant: str = "") -> AsyncIterator[Lease]:
        """`async with activator.leased(deadline) as lease`: `acquire`'s lease, released when the block ends,
        however it ends (an error, a cancellation)."""
        lease = await self.acquire(deadline, avoid, tenant)
        try:
            yield lease
        finally:
            lease.release()

    async def wait(self, deadline: float, keepalive_s: float = 10.0, avoid: Collection[Replica] = (),
                   tenant: str = "") -> AsyncIterator[StillWaiting | Lease]:
        """`StillWaiting` every `keepalive_s` while queued, then the `Lease` (or EndpointUnavailable).
        Close the iterator when leaving early (`contextlib.aclosing`): that takes the request out."""
        lease = self.take_free(avoid, tenant)
        if lease is not None:
            yield lease
            return
        waiter = self._enqueue(tenant)
        delivered = False
        try:
            while True:
                remaining = deadline - self.clock()
                if remaining <= 0:
                    self.turned_away += 1  # demand the next sample must see, if it left before one
                    self.on_demand()
                    raise self._refusal("scale_up_timeout", "no replica became ready in time")
                done, _ = await asyncio.wait({waiter.future}, timeout=min(keepalive_s, remaining))
                if done:
                    replica = waiter.future.result()  # raises what reject_all set
                    waited = self.clock() - waiter.enqueued
                    metrics.COLD_START.labels(self.name).observe(waited)
                    delivered = True
                    yield Lease(replica, waited, self, tenant)
                    return
                # only a keep-alive period's end says so: a timer that fires early (uvloop's have 1 ms steps)
                # must not turn the deadline's end into a keep-alive, which makes a plain answer a stream
                if keepalive_s < remaining:
                    yield StillWaiting(self.clock() - waiter.enqueued)
        finally:
            if not delivered:
                self._leave(waiter)

    def take_free(self, avoid: Collection[Replica] = (), tenant: str = "") -> Lease | None:
        """A lease at once when a replica is available and nobody waits before this request, else None
        (EndpointUnavailable for an endpoint that failed or is shutting down)."""
        self._refuse_if_closed(self.availability())
        replica = self._free_replica(avoid) if not self._queue else None
        return None if replica is None else self._lease(replica, 0.0, tenant)

    def release(self, lease: Lease) -> None:
        if lease.released:
            return
        lease.released = True
        lease.replica.in_flight -= 1
        self._held[lease.tenant] -= 1
        if self._held[lease.tenant] <= 0:
            del self._held[lease.tenant]
        self.pump()

    def pump(self) -> int:
        """Hand queued requests, in tenants' fair turns, to replicas with room under the release limit."""
        released = 0
        while self._queue:
            replica = self._replica_with_room()
            if replica is None:
                break
            waiter = self._next_turn()
            self._queue.remove(waiter)
            replica.in_flight += 1
            self._count(waiter.tenant)
            waiter.future.set_result(replica)
            released += 1
        metrics.QUEUE_DEPTH.labels(self.name).set(len(self._queue))
        return released

    def reject_all(self, code: str, message: str) -> None:
        """End every wait now (the endpoint failed or is going away)."""
        while self._queue:
            waiter = self._queue.popleft()
            waiter.future.set_exception(self._refusal(code, message))
        metrics.QUEUE_DEPTH.labels(self.name).set(0)

    # ---- internals ----

    def _refuse_if_closed(self, availability: Availability) -> None:
        """A failed endpoint, or one shutting down, takes nothing, not even onto a replica that is free."""
        if availability.state == "failed":
            raise self._refusal("endpoint_failed", "the endpoint failed", availability)
        if availability.state == "draining":
            raise self._refusal("endpoint_draining", "the endpoint is shutting down", availability)

    def _next_turn(self) -> _Waiter:
        """The waiter whose turn it is (the queue holds at most max_waiting)."""
        ahead: Counter[str] = Counter()
        best, best_key = None, None
        for position, waiter in enumerate(self._queue):
            tenant = waiter.tenant
            key = (self._held[tenant] + ahead[tenant], self._last.get(tenant, 0), position)
            ahead[tenant] += 1
            if best_key is None or key < best_key:
                best, best_key = waiter, key
        return best

    def _count(self, tenant: str) -> None:
        """One more lease of `tenant`, given now."""
        self._held[tenant] += 1
        self._last.pop(tenant, None)
        self._last[tenant] = next(self._served)
        if len(self._last) > _REMEMBERED:
            del self._last[next(iter(self._last))]

    def _enqueue(self, tenant: str) -> _Waiter:
        availability = self.availability()
        self._refuse_if_closed(availability)
        if len(self._queue) >= self.max_waiting:
            self.turned_away += 1  # still demand: with `max_waiting = 0` this is what wakes the endpoint
            self.on_demand()
            raise self._refusal("queue_full", f"{len(self._queue)} requests are already waiting", availability)
        waiter = _Waiter(self.clock(), tenant)
        self._queue.append(waiter)
        metrics.QUEUE_DEPTH.labels(self.name).set(len(self._queue))
        self.on_demand()
        return waiter

    def _leave(self, waiter: _Waiter) -> None:
        if waiter in self._queue:
            self._queue.remove(waiter)
            metrics.QUEUE_DEPTH.labels(self.name).set(len(self._queue))
        elif waiter.future.done() and not waiter.future.cancelled() and waiter.future.exception() is None:
            # handed a replica as it left: give it back
            Lease(waiter.future.result(), 0.0, self, waiter.tenant).release()

    def _free_replica(self, avoid: Collection[Replica]) -> Replica | None:
        # never past a replica's capacity (its rows and its worker's queue): the worker would refuse the request,
        # which waits here instead (and counts as demand)
        candidates = [r for r in self.pool.candidates() if r.in_flight < self.capacity]
        return next((r for r in candidates if r not in avoid), candidates[0] if candidates else None)

    def _replica_with_room(self) -> Replica | None:
        limit = self.release_limit if self.starting else self.capacity
        return next((r for r in self.pool.candidates() if r.in_flight < limit), None)

    def _lease(self, replica: Replica, waited: float, tenant: str) -> Lease:
        replica.in_flight += 1
        self._count(tenant)
        return Lease(replica, waited, self, tenant)

    def _refusal(self, code: str, message: str, availability: Availability | None = None) -> EndpointUnavailable:
        availability = availability or self.availability()
        metrics.REFUSED.labels(self.name, code).inc()
        reason = f": {availability.reason}" if availability.reason else ""
        return EndpointUnavailable(f"the model {self.name!r} is {availability.state.replace('_', ' ')}; "
                                   f"{message}{reason}", code=code, state=availability.state,
                                   reason=availability.reason, retry_after=availability.retry_after)
