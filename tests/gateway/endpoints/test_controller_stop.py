"""A stopping endpoint's loop ends, and stops renewing its fleet lease, whatever its tick was doing.

Before issue #50 the loop ended only by a cancel: a cancel that Python 3.11's `asyncio.wait_for` swallows (it
returns the inner call's result when that call finishes in the same turn as the cancel; redis-py wraps every
socket write in one when `socket_timeout` is set) left the loop running forever, renewing its lease without
scaling, and the gateway's shutdown awaiting it: seen live, 17 minutes, 9 of 50 leases held."""

from __future__ import annotations

import asyncio

from gateway.endpoints.controller import LOOP_STOP_S, EndpointController
from gateway.endpoints.fleet import LocalFleet
from gateway.endpoints.provisioners.static import StaticProvisioner
from gateway.endpoints.scaling import ScalingSettings
from gateway.endpoints.spec import EndpointSpec, StaticProvisioning
from gateway.replicas.pool import ReplicaRouter
from testkit.servers import free_port

SETTINGS = ScalingSettings(tick_seconds=0.05, fleet_sync_seconds=0.05, lease_seconds=1.0, standby_worker=False)
WAIT_S = 60  # generous: two shared cores


class HeldSyncs(LocalFleet):
    """The lone gateway's shared state, except that once `hold()` is called the next sync waits (through
    `asyncio.wait_for`, as redis-py's writes do) for the test to answer it or to let it go."""

    def __init__(self):
        super().__init__()
        self.syncs = 0
        self.held = asyncio.Event()  # a sync is waiting
        self._answer: asyncio.Future | None = None
        self._next: asyncio.Future | None = None  # armed by hold(), taken by the next sync
        self._swallow_every_cancel = False

    def hold(self, *, swallow_every_cancel: bool = False) -> None:
        self._next = self._answer = asyncio.get_running_loop().create_future()
        self._swallow_every_cancel = swallow_every_cancel

    def answer(self) -> None:
        self._answer.set_result(None)

    async def sync(self, endpoint, report, ttl_s, lease_s):
        self.syncs += 1
        answer, self._next = self._next, None
        if answer is not None:
            self.held.set()
            while True:
                try:
                    await asyncio.wait_for(asyncio.shield(answer), WAIT_S)
                    break
                except asyncio.CancelledError:
                    if not self._swallow_every_cancel:
                        raise
        return await super().sync(endpoint, report, ttl_s, lease_s)


async def started(fleet: HeldSyncs) -> EndpointController:
    spec = EndpointSpec(name="m", provisioner=StaticProvisioning(urls=[f"http://127.0.0.1:{free_port()}"]))
    controller = EndpointController(spec, StaticProvisioner(spec.provisioner.urls), ReplicaRouter(), SETTINGS,
                                    fleet=fleet)
    await controller.start()
    return controller


async def syncs_after(fleet: HeldSyncs, seconds: float) -> int:
    before = fleet.syncs
    await asyncio.sleep(seconds)
    return fleet.syncs - before


async def test_a_cancel_swallowed_inside_a_tick_still_ends_the_loop_and_its_renewals():
    fleet = HeldSyncs()
    controller = await started(fleet)
    fleet.hold()
    await asyncio.wait_for(fleet.held.wait(), WAIT_S)
    fleet.answer()  # the answer and the stop arrive in the same turn: wait_for returns it, the cancel is lost
    stop = asyncio.create_task(controller.drain_and_stop())
    done, _ = await asyncio.wait([stop], timeout=WAIT_S)
    assert done, "drain_and_stop never returned: the endpoint's loop survived its cancel"
    await stop
    assert controller._loop.done()
    assert await syncs_after(fleet, 20 * SETTINGS.fleet_sync_seconds) == 0  # the lease is no longer renewed


async def test_a_tick_that_never_ends_holds_the_stop_for_a_bounded_time_and_renews_nothing():
    fleet = HeldSyncs()
    controller = await started(fleet)
    fleet.hold(swallow_every_cancel=True)  # a call stuck in a library that eats every cancel
    await asyncio.wait_for(fleet.held.wait(), WAIT_S)
    stop = asyncio.create_task(controller.drain_and_stop())
    done, _ = await asyncio.wait([stop], timeout=LOOP_STOP_S + WAIT_S)
    assert done, "drain_and_stop waited past its bound for a stuck tick"
    await stop
    fleet.answer()  # the stuck call returns at last: the loop ends at once, with no sync after it
    await asyncio.wait_for(asyncio.shield(controller._loop), WAIT_S)
    assert await syncs_after(fleet, 20 * SETTINGS.fleet_sync_seconds) == 0
