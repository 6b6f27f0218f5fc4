"""A fleet whose Redis is away: the endpoint's loop logs the failing sync once with its traceback, not at every
tick. Before issue #50 each tick of each endpoint logged a full traceback (1.68 MB in 10 s with 10 endpoints)."""

from __future__ import annotations

import asyncio

from gateway.endpoints import repeated_failure
from gateway.endpoints.controller import EndpointController
from gateway.endpoints.fleet import RedisFleet
from gateway.endpoints.provisioners.static import StaticProvisioner
from gateway.endpoints.scaling import ScalingSettings
from gateway.endpoints.spec import EndpointSpec, StaticProvisioning
from gateway.replicas.pool import ReplicaRouter
from testkit.servers import free_port
from tests.logged import logged

SETTINGS = ScalingSettings(tick_seconds=0.05, fleet_sync_seconds=0.05, lease_seconds=1.0, standby_worker=False)


async def test_a_sync_failing_at_every_tick_is_logged_once(monkeypatch):
    events = logged(monkeypatch, repeated_failure)
    fleet = RedisFleet(f"redis://127.0.0.1:{free_port()}/0", timeout=0.5)  # nothing listens there
    spec = EndpointSpec(name="m", provisioner=StaticProvisioning(urls=[f"http://127.0.0.1:{free_port()}"]))
    controller = EndpointController(spec, StaticProvisioner(spec.provisioner.urls), ReplicaRouter(), SETTINGS,
                                    fleet=fleet)
    await controller.start()
    try:
        await asyncio.sleep(5.0)  # ticks every 50 ms
    finally:
        await controller.drain_and_stop()
        await fleet.close()
    lines = [event for event in events if event["event"].startswith("fleet_sync_failed")]
    tracebacks = [event for event in lines if "exc_info" in event]
    assert len(tracebacks) == 1 and len(lines) <= 2, lines  # the first one; a minute later, one with the count
