"""One endpoint's place in the fleet, as its controller sees it at each tick (fleet.py holds the shared state).

Every gateway publishes its report and reads the others' every `fleet_sync_seconds` while the endpoint is
busy (demand here or anywhere in the fleet, a request on a replica, a drain), and at once when demand appears
(then it also wakes the owner through the fleet, `Fleet.wake`). An idle endpoint's owner renews its lease every
`IDLE_OWNER_S`: in the gateway's one batch for all its idle leases (`batched`, lease_renewal.py), or by a sync
of its own; in a batch it syncs only when told, as the other gateways do (demand elsewhere wakes it). An idle
endpoint's other gateways do not sync it at all until told to (`changed`, by config_follower.py): when the owner
changed the shared state (a message, or the fleet's state version), when the lease's holder is gone, or in their
turn (one endpoint per look); their report counts while
their gateway is alive (one write per gateway, `Fleet.watch`), so an idle gateway's cost does not grow with the
number of endpoints. The fleet's demand feeds every gateway's autoscaler (so a gateway that takes over scaling
has warm windows), but only the lease holder acts on it. The holder's writes go through `write_window`, which checks its
token just before each write and says how long the lease is still certainly held; a holder that lost the lease
stops writing at the next check.

A replica being removed is drained fleet-wide: the owner marks it, every gateway stops routing to it and says
so in its report, and it may stop once every live gateway has said so and has nothing in flight on it
(`quiet`). A gateway whose report expired is gone, and so are its streams.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import structlog

from gateway.endpoints.fleet import Failure, Fleet, LocalFleet, Replicas, Report

log = structlog.get_logger(__name__)
REPORT_TTL_FACTOR = 3  # a report outlives this many missed publishes...
LEASES_PER_REPORT = 2  # ...and two leases: a stalled event loop must not look like a dead gateway (whose
# streams a drain would stop waiting for); a dead gateway's demand lingers this long, which only delays a scale-in
IDLE_OWNER_S = 1.0  # an idle endpoint's owner syncs this often (at most a fifth of the lease), renewing it
IDLE_REPORTS_PER_TTL = 3  # an idle gateway says it is alive this many times per report lifetime...
IDLE_FOLLOWER_MAX_S = 5.0  # ...and at least this often (config_follower.py)
# a write needs this much of the lease left after its fence check (ECS's connect timeout + the send; ecs.py),
# and at most a quarter of the lease
WRITE_MARGIN_S = 1.0


def report_ttl(sync_s: float, lease_s: float) -> float:
    """How long a gateway counts as alive (its reports with it) after it last said so."""
    return max(REPORT_TTL_FACTOR * sync_s, LEASES_PER_REPORT * lease_s)


def idle_owner_s(sync_s: float, lease_s: float) -> float:
    """How often an idle endpoint's owner renews its lease."""
    return max(sync_s, min(IDLE_OWNER_S, lease_s / 5))


def idle_watch_s(sync_s: float, lease_s: float) -> float:
    """How often an idle gateway says it is alive and looks for changes (config_follower.py)."""
    return max(sync_s, min(lease_s, report_ttl(sync_s, lease_s) / IDLE_REPORTS_PER_TTL, IDLE_FOLLOWER_MAX_S))


class Ownership:
    def __init__(self, fleet: Fleet, endpoint: str, *, sync_s: float, lease_s: float,
                 on_change: Callable[[bool], None] = lambda owner: None, poke: Callable[[], None] = lambda: None,
                 batched: bool = False):
        """`endpoint`: the key of the endpoint's shared state (its ECS service's, spec.py `fleet_key`); `poke`
        wakes the endpoint's loop (a change to look at); `batched`: the gateway's LeaseRenewal renews this lease
        while the endpoint is idle."""
        self.fleet = fleet
        self.endpoint = endpoint
        self.sync_s = sync_s
        self.lease_s = lease_s
        self.report_ttl_s = report_ttl(sync_s, lease_s)
        self.on_change = on_change
        self.poke = poke
        self.token: int | None = None
        self.holder: str | None = None  # the gateway holding the lease, as of the last sync
        self.reports: dict[str, Report] = {}
        self.draining: set[str] = set()  # replica ids marked draining in the shared state
        self.failure: Failure | None = None  # the endpoint's failure in the shared state, as of the last sync
        self.idle_owner_s = idle_owner_s(sync_s, lease_s)
        self.write_margin_s = min(WRITE_MARGIN_S, lease_s / 4)
        self.pace_s = sync_s  # the interval chosen at the last sync
        self.batched = batched
        self.renewing = False  # an idle owner whose lease the gateway's batch renews (until it is busy again)
        self.retired = False  # a stopping endpoint: nothing renews its lease any more
        self._next_sync = -math.inf
        self._renewed_at = -math.inf  # monotonic: when the sync that last returned our token began
        self._published_demand = 0.0
        self._report = Report(0.0)  # the last one published (a renewal before a write sends it again)
        self._shared: Replicas | None = None  # the replica list this gateway last wrote

    @property
    def owner(self) -> bool:
        return self.token is not None

    def fleet_demand(self, local: float) -> float:
        """This gateway's demand now plus every other live gateway's last report."""
        others = sum(report.demand for gateway, report in self.reports.items() if gateway != self.fleet.gateway_id)
        return others + local

    def due(self, now: float, demand: float) -> bool:
        """Sync now: the interval passed, or demand appeared (a waiting request must reach the owner at once)."""
        return now >= self._next_sync or (demand > 0 and self._published_demand == 0)

    async def sync(self, now: float, report: Report) -> None:
        self._next_sync = now + self.sync_s
        started = time.monotonic()
        token, self.reports, self.holder = await self.fleet.sync(self.endpoint, report, self.report_ttl_s,
                                                                 self.lease_s)
        if token is None and report.demand > 0 and self._published_demand == 0:
            await self.fleet.wake(self.endpoint)  # the owner looks at the new demand now, not at its idle pace
        self._published_demand = report.demand
        self._report = report
        self.draining = await self.fleet.draining(self.endpoint)
        self.failure = await self.fleet.failure(self.endpoint)
        if token is not None:
            self._renewed_at = started  # the lease runs lease_s from a moment after this at the earliest
        if (token is None) != (self.token is None) or (token is not None and token != self.token):
            log.info("endpoint_ownership", endpoint=self.endpoint, owner=token is not None, token=token,
                     gateway=self.fleet.gateway_id)
            self.token = token
            self.on_change(token is not None)
        busy = (report.demand > 0 or report.in_flight or self.draining
                or (token is not None and self.fleet_demand(report.demand) > 0))
        # idle and not the owner: no sync until told (`changed`); an idle owner in a batch likewise
        self.renewing = not busy and token is not None and self.batched and not self.retired
        self.pace_s = (self.sync_s if busy else self.idle_owner_s if token is not None and not self.renewing
                       else math.inf)
        self._next_sync = now + self.pace_s

    def renewed(self, token: int, started: float) -> None:
        """The batch that began at `started` (monotonic) renewed the lease of `token`."""
        if token == self.token:
            self._renewed_at = max(self._renewed_at, started)

    def not_renewed(self) -> None:
        """The batch found the lease lapsed or taken: sync at once to learn who holds it."""
        self.renewing = False
        self.changed()

    def retire(self) -> None:
        """A stopping endpoint: its lease is renewed no more (it lapses, unless the stop resigns it first)."""
        self.retired = True
        self.renewing = False

    def sync_soon(self) -> None:
        """Sync at the next tick (something to tell the fleet)."""
        self._next_sync = -math.inf

    def changed(self) -> None:
        """The fleet has news for this endpoint (the owner changed its state, its lease is free, demand came):
        sync at once."""
        self._next_sync = -math.inf
        self.poke()

    async def write_window(self) -> float:
        """Seconds during which a write this gateway starts now still lands inside its lease (0: write nothing):
        what is left of the lease since it was last renewed, less the write margin (a lease too near its end is
        renewed first, if it is still ours: a write that waited for the ECS budget is not lost for that), and the
        fence (the lease still holds our token, and no newer token wrote) checked now. Called immediately before
        each ECS write."""
        if self.token is None:
            return 0.0
        if isinstance(self.fleet, LocalFleet):  # this gateway alone: its lease never lapses
            return math.inf
        try:
            if self.lease_left() <= 0:
                started = time.monotonic()
                token, self.reports, self.holder = await self.fleet.sync(self.endpoint, self._report,
                                                                         self.report_ttl_s, self.lease_s)
                if token == self.token:
                    self._renewed_at = started
            held = self.lease_left() > 0 and await self.fleet.fence(self.endpoint, self.token)
        except Exception:  # the shared state cannot vouch for this token: write nothing
            log.warning("endpoint_fence_failed", endpoint=self.endpoint, exc_info=True)
            held = False
        if held:
            return self.lease_left()
        log.warning("endpoint_lease_lost", endpoint=self.endpoint, token=self.token)
        self.token = None
        self.on_change(False)
        return 0.0

    def lease_left(self) -> float:
        """Seconds a write started now has inside the lease, by this gateway's clock, less the write margin."""
        return self._renewed_at + self.lease_s - time.monotonic() - self.write_margin_s

    async def fenced(self) -> bool:
        """May this gateway write the endpoint's replica count now?"""
        return await self.write_window() > 0

    def in_flight(self, replica_id: str) -> int:
        """Requests on the replica over every live gateway (as of their last reports)."""
        return sum(report.in_flight.get(replica_id, 0) for report in self.reports.values())

    def quiet(self, replica_id: str) -> bool:
        """Every live gateway stopped routing to the draining replica and has nothing left on it."""
        return all(replica_id in report.draining_seen and not report.in_flight.get(replica_id)
                   for report in self.reports.values())

    async def mark_draining(self, replica_id: str) -> None:
        self.draining.add(replica_id)
        self.sync_soon()  # busy now: the drain needs every gateway's acknowledgement
        await self.fleet.mark_draining(self.endpoint, replica_id)

    async def share(self, replicas: list[tuple[str, str | None]], desired: int) -> None:
        """The owner's look at its replicas, written (and announced to the fleet) only when it changed."""
        if self.token is not None:
            shared = Replicas(self.token, replicas, desired)
            if shared != self._shared:
                await self.fleet.share(self.endpoint, shared)
                self._shared = shared
            gone = self.draining - {replica_id for replica_id, _ in replicas}
            if gone:
                await self.fleet.forget_draining(self.endpoint, gone)
                self.draining -= gone

    async def shared(self) -> Replicas | None:
        return await self.fleet.shared(self.endpoint)

    async def resign(self) -> None:
        self.token = None
        self.renewing = False
        await self.fleet.resign(self.endpoint)
