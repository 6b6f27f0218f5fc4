"""Admin changes and failures reach every gateway of a fleet (issue #50): two in-process gateways (`Endpoints`) share
a real PostgreSQL database and their fleet state in a real redis-server or in that PostgreSQL; an endpoint created,
patched or deleted on one is served, changed or stopped by the other, a missed change message converges, and an
ECS endpoint's failure (moto's ECS) holds on every gateway and across a lease move."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
import pytest
import redis as redis_client

from gateway.endpoints import controller as controller_module
from gateway.endpoints.errors import EndpointConflict, EndpointNotFound, EndpointUnavailable
from gateway.endpoints.fleet import Fleet, RedisFleet
from gateway.endpoints.fleet_postgres import PostgresFleet
from gateway.endpoints.registry import EndpointRegistry
from gateway.endpoints.scaling import ScalingSettings
from gateway.endpoints.service import Endpoints, default_provisioners
from gateway.endpoints.spec import parse_endpoint
from gateway.endpoints.store import EndpointStore
from testkit.databases import create_database
from testkit.played_ecs import CLUSTER, PORT, SERVICE, desired_count
from tests.gateway.endpoints.helpers import until
from tests.logged import logged

SETTINGS = dict(stable_window_seconds=3, panic_window_seconds=1, tick_seconds=0.1, standby_worker=False,
                health_interval_seconds=0.2, fleet_sync_seconds=0.1, lease_seconds=1.0)
# local workers (this gateway's own), none started: nothing asks for one at min_replicas 0
LOCAL = {"min_replicas": 0, "max_replicas": 1, "provisioner": {"kind": "local"}}
WAIT_S = 60
Gateways = Callable[..., Awaitable[list[Endpoints]]]


@pytest.fixture(params=["redis", "postgres"])
async def gateways(request, postgres, tmp_path) -> AsyncIterator[Gateways]:
    """A factory of `count` gateways on one fresh database, the fleet state in Redis (a fresh key prefix) or in
    the database itself."""
    database = await create_database(postgres.url, "fleetcfg")
    prefix = f"test-fleetcfg:{uuid.uuid4().hex[:8]}"
    opened: list[Endpoints] = []

    async def fleet_of(name: str, settings: ScalingSettings) -> Fleet:
        if request.param == "redis":
            return RedisFleet(request.getfixturevalue("redis").url, prefix=prefix, gateway_id=name,
                              calls_per_second=settings.ecs_api_calls_per_second)
        return await PostgresFleet.open(database, gateway_id=name, calls_per_second=settings.ecs_api_calls_per_second)

    async def make(count: int, **settings) -> list[Endpoints]:
        scaling = ScalingSettings(**{**SETTINGS, **settings})
        for n in range(count):
            store = await EndpointStore.open(database)
            endpoints = Endpoints(EndpointRegistry(store, []), store, scaling, default_provisioners(tmp_path, None),
                                  fleet=await fleet_of(f"gateway-{n}", scaling))
            await endpoints.start()
            opened.append(endpoints)
        return opened[-count:]

    make.kind = request.param
    make.database = database
    yield make
    for endpoints in opened:
        await endpoints.drain_and_stop()


async def test_create_patch_and_delete_on_one_gateway_reach_the_other(gateways):
    a, b = await gateways(2, fleet_config_check_seconds=3600)  # the change messages alone carry it
    await a.create({"name": "made-on-a", **LOCAL})
    await until(lambda: "made-on-a" in b.controllers, WAIT_S, "the created endpoint on gateway B")
    assert b.resolve("made-on-a", None).spec.max_replicas == 1

    await a.patch("made-on-a", {"max_replicas": 4, "idle_seconds": 30})
    await until(lambda: b.controllers["made-on-a"].spec.max_replicas == 4, WAIT_S, "the patch on gateway B")
    assert b.get("made-on-a").spec.idle_seconds == 30

    await b.patch("made-on-a", {"max_waiting": 7})  # B changes what A changed: A's patch is kept
    await until(lambda: a.controllers["made-on-a"].spec.max_waiting == 7, WAIT_S, "B's patch on gateway A")
    assert a.get("made-on-a").spec.max_replicas == 4

    await a.delete("made-on-a")
    await until(lambda: "made-on-a" not in b.controllers, WAIT_S, "the delete on gateway B")
    with pytest.raises(EndpointNotFound):
        b.resolve("made-on-a", None)
    assert "made-on-a" not in b.router.pools


async def test_a_name_another_gateway_created_meanwhile_is_a_conflict_not_an_overwrite(gateways):
    a, b = await gateways(2, fleet_config_check_seconds=3600)
    await b.follower.close()  # B has not heard of A's endpoint yet when its own create of the name comes
    await a.create({"name": "taken", **LOCAL, "max_replicas": 3})
    with pytest.raises(EndpointConflict):
        await b.registry.create(parse_endpoint({"name": "taken", **LOCAL}))
    assert (await a.store.rows())[0].body["max_replicas"] == 3


async def test_a_change_whose_message_was_lost_converges_at_the_next_check(gateways, request):
    a, b = await gateways(2, fleet_config_check_seconds=0.2)
    await a.create({"name": "first", **LOCAL})
    await until(lambda: "first" in b.controllers, WAIT_S, "the first change on gateway B")
    # cut every listener's connection: the next change's message reaches no one
    if gateways.kind == "redis":
        admin = redis_client.Redis.from_url(request.getfixturevalue("redis").url)
        admin.client_kill_filter(_type="pubsub")
        admin.close()
    else:
        connection = await asyncpg.connect(gateways.database)
        try:
            await connection.execute("""SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                                         WHERE datname = current_database() AND query LIKE 'LISTEN%'""")
        finally:
            await connection.close()
    await a.patch("first", {"max_replicas": 2})
    await until(lambda: b.controllers["first"].spec.max_replicas == 2, WAIT_S, "the patch after a lost message")


async def test_a_row_this_version_cannot_read_stops_nothing(gateways):
    a, b = await gateways(2, fleet_config_check_seconds=3600)
    await a.create({"name": "running", **LOCAL})
    await until(lambda: "running" in b.controllers, WAIT_S, "the endpoint on gateway B")
    row = (await a.store.rows())[0]
    await a.store.put("running", "api", {**row.body, "max_replicas": {"per_zone": 2}})  # a newer gateway's form
    version = await a.fleet.bump_config()
    await until(lambda: b.follower.version == version, WAIT_S, "B's reload")
    assert "running" in b.controllers and b.resolve("running", None).state != "draining"


# ---- ECS endpoints: the failure and the delete, fleet-wide ----

@pytest.fixture
def ecs(aws):
    return aws[0]


def _ecs_body(moto_url: str, **fields) -> dict:
    return {"name": "gpu", "min_replicas": 1, "max_replicas": 2, "drain_seconds": 1,
            "provisioner": {"kind": "ecs", "cluster": CLUSTER, "service": SERVICE, "endpoint_url": moto_url,
                            "port": PORT}, **fields}


async def _owner_and_other(a: Endpoints, b: Endpoints) -> tuple[Endpoints, Endpoints]:
    """(the gateway that holds gpu's lease, the other): A that created it, unless B's loop synced first (it can,
    once A's create message reached it)."""
    def owners() -> list[Endpoints]:
        return [g for g in (a, b) if "gpu" in g.controllers and g.controllers["gpu"].ownership.owner]

    await until(lambda: len(owners()) == 1, WAIT_S, "one owner of gpu")
    return (a, b) if owners() == [a] else (b, a)


async def test_a_failed_ecs_endpoint_fails_on_every_gateway_and_stays_failed_across_a_lease_move(
        gateways, ecs, moto_url, monkeypatch):
    # moto schedules no task: the owner's start gets no address and times out, a crash loop at the first; a lease
    # far longer than the test keeps the owner until it stops, so the other only learns of it from the fleet
    a, b = await gateways(2, start_failures=1, ecs_start_timeout_seconds=0.5, lease_seconds=600)
    await a.create(_ecs_body(moto_url))
    await until(lambda: "gpu" in b.controllers, WAIT_S, "the ECS endpoint on gateway B")
    owner, other = await _owner_and_other(a, b)
    await until(lambda: owner.controllers["gpu"].state == "failed", WAIT_S, "the owner's failure")
    follower = other.controllers["gpu"]
    assert not follower.ownership.owner
    await until(lambda: follower.state == "failed", WAIT_S, "the failure on the other gateway")
    with pytest.raises(EndpointUnavailable) as refused:  # at once, not after the request's whole wait
        await follower.activator.acquire(time.monotonic() + 600)
    assert refused.value.code == "endpoint_failed" and refused.value.reason == "crash loop"
    await until(lambda: desired_count(ecs) == 0, WAIT_S, "the failed endpoint's service at 0")

    await owner.drain_and_stop()  # the lease moves to the other gateway
    events = logged(monkeypatch, controller_module)
    await until(lambda: follower.ownership.owner, WAIT_S, "the other gateway taking the lease")
    for _ in range(3):  # whole ticks as owner: a new owner that forgot the failure starts a task here
        await follower.tick()
    assert follower.state == "failed" and desired_count(ecs) == 0
    assert not [e for e in events if e["event"] in ("endpoint_scale_up", "replica_start_failed")], events

    await other.patch("gpu", {"min_replicas": 0})  # the operator's retry clears it on every gateway
    assert other.get("gpu").state != "failed" and await other.fleet.failure("gpu") is None


async def test_an_ecs_endpoint_deleted_on_a_follower_is_stopped_by_its_owner_and_scaled_by_no_one(
        gateways, ecs, moto_url):
    a, b = await gateways(2)
    await a.create(_ecs_body(moto_url, min_replicas=1))  # A creates it, owns it, asks ECS for a task
    await until(lambda: desired_count(ecs) == 1, WAIT_S, "the owner's scale-up to min_replicas")
    await until(lambda: "gpu" in b.controllers, WAIT_S, "the ECS endpoint on gateway B")
    owner, other = await _owner_and_other(a, b)

    await other.delete("gpu")  # on the gateway that does not own it
    await until(lambda: "gpu" not in owner.controllers, WAIT_S, "the delete on the owner")
    await until(lambda: desired_count(ecs) == 0, WAIT_S, "the deleted endpoint's service at 0")
    for endpoints in (a, b):
        with pytest.raises(EndpointNotFound):
            endpoints.resolve("gpu", None)
        assert "gpu" not in endpoints.controllers  # no loop left anywhere to scale it again
    assert desired_count(ecs) == 0
