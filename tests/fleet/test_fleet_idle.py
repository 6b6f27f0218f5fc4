"""An idle gateway's fleet bookkeeping does not grow with its endpoints (issue #50): a gateway that owns none of
them makes a constant number of Redis commands per look at the fleet, counted on a real redis-server (MONITOR),
and a change an owner makes still reaches every other gateway, by message or, a message lost, by the fleet's
state version (Redis and PostgreSQL). And one endpoint per ECS service when a gateway starts."""

from __future__ import annotations

import asyncio
import hashlib
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import redis as redis_client

from gateway.endpoints import fleet as fleet_module
from gateway.endpoints import service as service_module
from gateway.endpoints.fleet import Fleet, RedisFleet
from gateway.endpoints.fleet_postgres import PostgresFleet
from gateway.endpoints.registry import EndpointRegistry
from gateway.endpoints.scaling import ScalingSettings
from gateway.endpoints.service import CALLS_PER_LOOK, STEADY_SHARE, Endpoints, default_provisioners
from gateway.endpoints.spec import EndpointSpec, parse_endpoint
from gateway.endpoints.store import EndpointStore
from testkit.databases import create_database
from testkit.played_ecs import CLUSTER, PORT, SERVICE
from tests.fleet.fleet import cut_listeners
from tests.gateway.endpoints.helpers import until
from tests.logged import logged

# a look at the fleet every 2/3 s (idle_watch_s), a lease renewed every 0.2 s by its owner
SETTINGS = dict(tick_seconds=0.25, standby_worker=False, fleet_sync_seconds=0.1, lease_seconds=1.0,
                ecs_api_calls_per_second=50, fleet_config_check_seconds=3600)
ENDPOINTS = 12
WAIT_S = 90
# per look: alive + the state version (2), and one endpoint's backstop sync (about 10); an idle gateway that synced
# every endpoint at each look would make about 9 x ENDPOINTS
COMMANDS_PER_LOOK = 16
Gateway = Callable[..., Awaitable[Endpoints]]


def _ecs(moto_url: str, name: str, service: str, **fields) -> EndpointSpec:
    return parse_endpoint({"name": name, "min_replicas": 0, "max_replicas": 1, **fields,
                           "provisioner": {"kind": "ecs", "cluster": CLUSTER, "service": service,
                                           "endpoint_url": moto_url, "port": PORT}})


@pytest.fixture(params=["redis", "postgres"])
async def gateway(request, postgres, tmp_path) -> AsyncIterator[Gateway]:
    """A factory of gateways on one fresh database, declaring `specs`, the fleet state in Redis or PostgreSQL."""
    database = await create_database(postgres.url, "fleetidle")
    prefix = f"test-fleetidle:{uuid.uuid4().hex[:8]}"
    opened: list[Endpoints] = []

    async def make(name: str, specs: list[EndpointSpec], client_name: str = "", **settings) -> Endpoints:
        scaling = ScalingSettings(**{**SETTINGS, **settings})
        if request.param == "redis":
            url = request.getfixturevalue("redis").url + (f"?client_name={client_name}" if client_name else "")
            fleet: Fleet = RedisFleet(url, prefix=prefix, gateway_id=name, calls_per_second=50)
        else:
            fleet = await PostgresFleet.open(database, gateway_id=name, calls_per_second=50)
        store = await EndpointStore.open(database)
        endpoints = Endpoints(EndpointRegistry(store, specs), store, scaling, default_provisioners(tmp_path, None),
                              fleet=fleet)
        await endpoints.start()
        opened.append(endpoints)
        return endpoints

    make.kind = request.param
    make.database = database
    make.prefix = prefix
    yield make
    for endpoints in opened:
        await endpoints.drain_and_stop()


@pytest.fixture
def services(aws) -> list[str]:
    """ENDPOINTS more ECS services of the cluster, at desiredCount 0."""
    ecs, network = aws
    names = [f"idle-{n:02d}" for n in range(ENDPOINTS)]
    for name in names:
        ecs.create_service(cluster=CLUSTER, serviceName=name, taskDefinition=SERVICE, desiredCount=0,
                           launchType="FARGATE", networkConfiguration=network)
    yield names
    for name in names:
        ecs.delete_service(cluster=CLUSTER, service=name, force=True)


class Monitor:
    """Every command redis-server runs for the clients named `name` (CLIENT SETNAME), through MONITOR."""

    def __init__(self, url: str, name: str):
        self.url, self.name = url, name
        self.commands: list[str] = []
        self._seen: list[tuple[str, str]] = []  # (client address, command)
        self._started = threading.Event()
        self._wake = f"monitor-done-{uuid.uuid4().hex}"
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        server = redis_client.Redis.from_url(self.url)
        with server.monitor() as monitor:
            self._started.set()
            for command in monitor.listen():
                # the wake-up ECHO comes after every command run before __exit__: those are all kept
                if command["command"] == f"ECHO {self._wake}":
                    break
                self._seen.append((f"{command.get('client_address')}:{command.get('client_port')}",
                                   command["command"]))
        server.close()

    def __enter__(self) -> Monitor:
        self._thread.start()
        assert self._started.wait(WAIT_S)
        return self

    def __exit__(self, *exc) -> None:
        server = redis_client.Redis.from_url(self.url)
        server.echo(self._wake)  # a last command wakes the MONITOR loop
        self._thread.join(WAIT_S)
        named = {c["addr"] for c in server.client_list() if c.get("name") == self.name}  # pooled: still open
        server.close()
        self.commands = [command for address, command in self._seen if address in named]


async def test_an_idle_follower_makes_a_constant_number_of_commands_per_look(gateway, services, moto_url, request):
    if gateway.kind != "redis":
        pytest.skip("commands are counted on redis-server (MONITOR); PostgreSQL runs the same follower")
    specs = [_ecs(moto_url, f"idle/{n:02d}", service) for n, service in enumerate(services)]
    owner = await gateway("owner", specs)
    await until(lambda: all(c.adopted for c in owner.controllers.values()), WAIT_S, "the owner adopting every one")
    follower = await gateway("follower", specs, client_name="idle-follower")
    controllers = list(follower.controllers.values())
    await until(lambda: all(c.ownership.holder == "owner" for c in controllers), WAIT_S, "every first sync")
    url = request.getfixturevalue("redis").url
    for _ in range(5):  # a window in which nothing changed (the owner's first shares settle first)
        await until(lambda: follower.follower.watches >= 2, WAIT_S, "the follower's looks")
        version, looks = follower.follower.state_version, follower.follower.watches
        with Monitor(url, "idle-follower") as monitor:
            await until(lambda n=looks: follower.follower.watches >= n + 6, WAIT_S, "six looks")
        await asyncio.sleep(0)
        looked = follower.follower.watches - looks
        if follower.follower.state_version == version:
            break
    else:
        pytest.fail("the owner's state kept changing")
    assert not any(c.ownership.owner for c in controllers)
    assert len(monitor.commands) <= COMMANDS_PER_LOOK * (looked + 1), (looked, monitor.commands)
    assert 2 * looked <= len(monitor.commands)  # the looks themselves were counted


async def test_an_owners_change_reaches_every_follower_by_message_or_by_the_state_version(gateway, aws, moto_url,
                                                                                         request):
    # moto runs no task: the one the owner asks for never gets an address, and its start times out (a crash loop)
    spec = _ecs(moto_url, "gpu", SERVICE)
    owner = await gateway("owner", [spec], start_failures=1, ecs_start_timeout_seconds=8)
    await until(lambda: owner.controllers["gpu"].adopted, WAIT_S, "the owner adopting the service")
    followers = [await gateway(f"follower-{n}", [spec]) for n in range(2)]
    for endpoints in followers:
        await until(lambda e=endpoints: e.controllers["gpu"].ownership.holder == "owner", WAIT_S, "a first sync")

    redis_url = request.getfixturevalue("redis").url if gateway.kind == "redis" else ""
    await cut_listeners(gateway.kind, gateway.database, redis_url)  # no message: a later look finds the change
    await owner.patch("gpu", {"min_replicas": 1})  # the owner asks ECS for a task: its shared count is 1
    for endpoints in followers:
        await until(lambda e=endpoints: e.controllers["gpu"].desired == 1, WAIT_S, "the owner's count on a follower")
    # the owner's next change (the failed start) reaches them too
    for endpoints in followers:
        await until(lambda e=endpoints: e.controllers["gpu"].state == "failed", WAIT_S, "the owner's failure")
    assert owner.controllers["gpu"].state == "failed"
    assert not any(e.controllers["gpu"].ownership.owner for e in followers)


async def test_a_stored_endpoint_on_a_service_the_config_file_now_names_is_not_started(gateway, aws, moto_url,
                                                                                        monkeypatch):
    first = await gateway("first", [])
    await first.create(_ecs(moto_url, "made-by-api", SERVICE))
    events = logged(monkeypatch, service_module)
    second = await gateway("second", [_ecs(moto_url, "from-the-file", SERVICE)])  # its file now names the service
    assert set(second.controllers) == {"from-the-file"}  # the file's entry serves it; the gateway started
    taken = [e for e in events if e["event"] == "endpoint_service_taken"]
    assert [e["endpoint"] for e in taken] == ["made-by-api"] and "'from-the-file'" in taken[0]["reason"]


async def test_an_idle_owner_renews_all_its_leases_in_one_round_trip(gateway, services, moto_url, request):
    """Before, each idle endpoint's owner synced it every renewal (about 8 commands an endpoint); now one batch
    renews every lease (lease_renewal.py) and the owner syncs only when told, so its commands do not grow with its
    endpoints. A stopping endpoint's lease is left out of the batch and lapses."""
    specs = [_ecs(moto_url, f"owned/{n:02d}", service) for n, service in enumerate(services)]
    # the settings' ECS budget paces each owner's steady look at its tasks (12 endpoints: every 12 s)
    owner = await gateway("owner", specs, client_name="idle-owner", ecs_api_calls_per_second=2)
    controllers = list(owner.controllers.values())
    await until(lambda: all(c.adopted and c.ownership.renewing for c in controllers), WAIT_S, "every idle lease")
    renewal, follower = owner.renewal, owner.follower
    # discovery at scale: every owner's steady look together takes half the ECS budget (12 x 2 calls / 1 call/s)
    assert {c.provisioner.steady_interval_s for c in controllers} == {ENDPOINTS * CALLS_PER_LOOK / (STEADY_SHARE * 2)}
    if gateway.kind == "redis":
        url = request.getfixturevalue("redis").url
        for _ in range(5):  # a window in which nothing changed (the first shares settle first)
            version, batches, looks = follower.state_version, renewal.batches, follower.watches
            with Monitor(url, "idle-owner") as monitor:
                await until(lambda n=batches: renewal.batches >= n + 10, WAIT_S, "ten renewals")
            await asyncio.sleep(0)
            renewed, looked = renewal.batches - batches, follower.watches - looks
            if follower.state_version == version:
                break
        else:
            pytest.fail("the owner's state kept changing")
        script = hashlib.sha1(fleet_module._RENEW.encode()).hexdigest()
        batched = [c for c in monitor.commands if c.startswith(f"EVALSHA {script} {ENDPOINTS} ")]
        # the batches were counted: one script for every lease (one may have run just before MONITOR took effect
        # and been counted as its reply came back after)
        assert len(batched) >= renewed - 1
        # a renewal is one script; a look two commands and one endpoint's backstop sync
        assert len(monitor.commands) <= (renewed + 1) + COMMANDS_PER_LOOK * (looked + 1), (renewed, looked,
                                                                                           monitor.commands)
    else:
        batches = renewal.batches
        await until(lambda: renewal.batches >= batches + 10, WAIT_S, "ten renewals")
    assert all(c.ownership.owner for c in controllers)  # and every lease still held
    retired = controllers[0].ownership
    retired.retire()  # as a stopping endpoint's loop does
    other = await gateway("other", specs[:1])
    await until(lambda: other.controllers[specs[0].name].ownership.owner, WAIT_S, "the lapsed lease taken over")
    assert all(c.ownership.owner for c in controllers[1:])
