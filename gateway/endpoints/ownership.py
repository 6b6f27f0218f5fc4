"""One endpoint's place in the fleet, as its controller sees it at each tick (fleet.py holds the shared state).

Every gateway publishes its report and reads the others' every `fleet_sync_seconds` while the endpoint is
busy (demand here or anywhere in the fleet, a request on a replica, a drain), and at once when demand appears.
An idle endpoint is synced at a slower pace (`IDLE_OWNER_S` for the owner, which must notice another
gateway's new demand soon; a third of the report's lifetime for the others, which only keep their report alive
and watch for a dead owner's lease): idle bookkeeping no longer grows with fleet_sync_seconds x endpoints x
gateways. The fleet's demand feeds every gateway's autoscaler (so a gateway that takes over scaling has warm
windows), but only the lease holder acts on it. The holder's writes go through `write_window`, which checks its
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
IDLE_OWNER_S = 1.0  # an idle endpoint's owner syncs this often (at most a fifth of the lease): it sees new demand
IDLE_REPORTS_PER_TTL = 3  # an idle follower refreshes its report this many times per report lifetime
IDLE_FOLLOWER_MAX_S = 5.0  # and at least this often, whatever the lease: it learns of a failure or a drain
# a write needs this much of the lease left after its fence check (ECS's connect timeout + the send; ecs.py),
# and at most a quarter of the lease
WRITE_MARGIN_S = 1.0


class Ownership:
    def __init__(self, fleet: Fleet, endpoint: str, *, sync_s: float, lease_s: float,
                 on_change: Callable[[bool], None] = lambda owner: None):
        self.fleet = fleet
        self.endpoint = endpoint
        self.sync_s = sync_s
        self.lease_s = lease_s
        self.report_ttl_s = max(REPORT_TTL_FACTOR * sync_s, LEASES_PER_REPORT * lease_s)
        self.on_change = on_change
        self.token: int | None = None
        self.reports: dict[str, Report] = {}
        self.draining: set[str] = set()  # replica ids marked draining in the shared state
        self.failure: Failure | None = None  # the endpoint's failure in the shared state, as of the last sync
        self.idle_owner_s = max(sync_s, min(IDLE_OWNER_S, lease_s / 5))
        self.idle_follower_s = max(sync_s, min(lease_s, self.report_ttl_s / IDLE_REPORTS_PER_TTL, IDLE_FOLLOWER_MAX_S))
        self.write_margin_s = min(WRITE_MARGIN_S, lease_s / 4)
        self.pace_s = sync_s  # the interval chosen at the last sync
        self._next_sync = -math.inf
        self._renewed_at = -math.inf  # monotonic: when the sync that last returned our token began
        self._published_demand = 0.0
        self._report = Report(0.0)  # the last one published (a renewal before a write sends it again)

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
        token, self.reports = await self.fleet.sync(self.endpoint, report, self.report_ttl_s, self.lease_s)
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
        self.pace_s = self.sync_s if busy else self.idle_owner_s if token is not None else self.idle_follower_s
        self._next_sync = now + self.pace_s

    def sync_soon(self) -> None:
        """Sync at the next tick (something to tell the fleet)."""
        self._next_sync = -math.inf

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
                token, self.reports = await self.fleet.sync(self.endpoint, self._report, self.report_ttl_s,
                                                            self.lease_s)
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
        await self.fleet.mark_draining(self.endpoint, replica_id)

    async def share(self, replicas: list[tuple[str, str | None]], desired: int) -> None:
        if self.token is not None:
            await self.fleet.share(self.endpoint, Replicas(self.token, replicas, desired))
            gone = self.draining - {replica_id for replica_id, _ in replicas}
            if gone:
                await self.fleet.forget_draining(self.endpoint, gone)
                self.draining -= gone

    async def shared(self) -> Replicas | None:
        return await self.fleet.shared(self.endpoint)

    async def resign(self) -> None:
        self.token = None
        await self.fleet.resign(self.endpoint)
