"""Admin changes and failures reach every gateway of a fleet (issue #50): two in-process gateways (`Endpoints`) share
a real PostgreSQL database and their fleet state in a real redis-server or in that PostgreSQL; an endpoint created,
patched or deleted on one is served, changed or stopped by the other, a missed change message converges, and an
ECS endpoint's failure (moto's ECS) holds on every gateway and across a lease move."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec
import pytest

from gateway.config import load_settings
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
from tests.fleet.fleet import cut_listeners
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
    await until(lambda: "made-on-a" not in b.router.pools, WAIT_S, "the delete on gateway B")  # its last step
    with pytest.raises(EndpointNotFound):
        b.resolve("made-on-a", None)
    assert "made-on-a" not in b.controllers


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
    await cut_listeners(gateways.kind, gateways.database,
                        request.getfixturevalue("redis").url if gateways.kind == "redis" else "")
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
    assert other.get("gpu").state != "failed" and await other.fleet.failure(follower.spec.fleet_key) is None


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


# ---- one endpoint per ECS service: the lease is the service's ----

SERVICE_2 = "other-llama"


@pytest.fixture
def second_service(aws):
    """Another ECS service of the cluster, at desiredCount 0."""
    ecs, network = aws
    ecs.create_service(cluster=CLUSTER, serviceName=SERVICE_2, taskDefinition=SERVICE, desiredCount=0,
                       launchType="FARGATE", networkConfiguration=network)
    yield SERVICE_2
    ecs.delete_service(cluster=CLUSTER, service=SERVICE_2, force=True)


async def test_two_names_on_one_ecs_service_have_one_owner_and_the_second_config_is_refused(gateways, ecs, moto_url):
    a, b = await gateways(2, fleet_config_check_seconds=3600)
    await b.follower.close()  # B has not heard of A's endpoint when its own config of the service comes
    await a.create(_ecs_body(moto_url, min_replicas=0))
    with pytest.raises(EndpointConflict) as refused:  # the same service under another name: stored, then withdrawn
        await b.registry.create(parse_endpoint(_ecs_body(moto_url, name="gpu-again", min_replicas=0)))
    assert "'gpu'" in str(refused.value) and SERVICE in str(refused.value)
    assert [row.name for row in await a.store.rows()] == ["gpu"]

    # gateways mid-deploy whose config files name the service twice: one lease, the service's, so one owner
    declared_on_b = await b._launch(parse_endpoint(_ecs_body(moto_url, name="gpu-b", min_replicas=0)))
    pair = [a.controllers["gpu"], declared_on_b]
    assert pair[0].ownership.endpoint == pair[1].ownership.endpoint == f"ecs:us-east-1:{CLUSTER}:{SERVICE}"
    await until(lambda: sum(c.ownership.owner for c in pair) == 1, WAIT_S, "one owner of the service")
    for _ in range(3):
        for controller in pair:
            await controller.tick()
        assert sum(c.ownership.owner for c in pair) == 1
    with pytest.raises(EndpointConflict):  # one gateway never runs two loops on one service
        await b._launch(parse_endpoint(_ecs_body(moto_url, name="gpu-c", min_replicas=0)))
    with pytest.raises(EndpointConflict):  # through the API (a 409), before anything is stored
        await a.create(_ecs_body(moto_url, name="gpu-again", min_replicas=0))
    assert [row.name for row in await a.store.rows()] == ["gpu"]


async def test_a_name_deleted_and_created_on_another_service_takes_no_old_lease(gateways, ecs, moto_url,
                                                                                 second_service):
    # a lease that never lapses here: B must still own the first service when it hears of the delete (with 5 s, a
    # renewal late on a machine beside two CPU hogs let A take it first), and the test lets go of it explicitly
    a, b = await gateways(2, fleet_config_check_seconds=3600, lease_seconds=600)
    await b.create(_ecs_body(moto_url, min_replicas=1))  # B owns it and scales the first service to 1
    await until(lambda: desired_count(ecs) == 1, WAIT_S, "the first service at 1")
    await until(lambda: "gpu" in a.controllers, WAIT_S, "gpu on gateway A")
    old = b.controllers["gpu"]
    assert old.ownership.owner
    await b.follower.close()  # B misses the delete and the create: it sees both at once at its reload

    await a.delete("gpu")
    body = _ecs_body(moto_url, min_replicas=0)
    body["provisioner"]["service"] = second_service
    await a.create(body)
    await b.reload()
    new = b.controllers["gpu"]
    assert new is not old and new.spec.provisioner.service == second_service  # a new endpoint, not a patch
    assert new.ownership.endpoint == f"ecs:us-east-1:{CLUSTER}:{second_service}" != old.ownership.endpoint
    assert not old.ownership.owner  # the old service's lease was let go, not carried over
    await until(lambda: desired_count(ecs) == 0, WAIT_S, "the deleted endpoint's service at 0")


def test_a_config_file_naming_one_ecs_service_twice_is_refused_at_start(tmp_path):
    provisioner = f'[models.provisioner]\nkind = "ecs"\ncluster = "{CLUSTER}"\nservice = "{SERVICE}"\n'
    config = tmp_path / "sluice.toml"
    config.write_text("".join(f'[[models]]\nname = "{name}"\n{provisioner}\n' for name in ("one", "two")))
    with pytest.raises(SystemExit) as failure:
        load_settings(str(config))
    message = str(failure.value)
    assert message.startswith("sluice: ") and "'one'" in message and "$.models[1]" in message, message


@pytest.mark.parametrize("field", ["cluster", "service", "region"])
def test_an_ecs_name_that_is_no_name_or_arn_is_refused(field):
    raw = {"name": "gpu", "provisioner": {"kind": "ecs", "cluster": "c", "service": "s", field: "a}b"}}
    with pytest.raises(msgspec.ValidationError, match=f"provisioner.{field}"):
        parse_endpoint(raw)
    raw["provisioner"][field] = "x" * 513
    with pytest.raises(msgspec.ValidationError, match=f"provisioner.{field}"):
        parse_endpoint(raw)
