"""Who may write an ECS service, and what: gateways in this process sharing a real redis-server, ECS in moto.

- A deposed owner's late write cannot add a task: the fence is checked immediately before each write, with what
  is left of the lease, and a scale-up writes the decision's absolute count (never "what ECS says + 1").
- No scale-in before the provisioner has listed the service's tasks since it adopted it: the tasks a scale-in
  keeps are protected, so it must know them.
- Idle bookkeeping: an idle endpoint's gateways touch Redis at a slow pace, not every `fleet_sync_seconds`.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import boto3
import pytest
import redis as redis_client
from botocore.config import Config

from gateway.endpoints.controller import EndpointController
from gateway.endpoints.fleet import RedisFleet, Report
from gateway.endpoints.ownership import Ownership
from gateway.endpoints.provisioners.base import FenceLost, ProvisionerBackoff
from gateway.endpoints.provisioners.ecs import EcsProvisioner
from gateway.endpoints.scaling import ScalingSettings
from gateway.endpoints.service import Endpoints
from gateway.endpoints.spec import EcsProvisioning, parse_endpoint
from gateway.replicas.pool import ReplicaRouter
from testkit.played_ecs import CLUSTER, PORT, SERVICE, desired_count
from tests.fleet.fleet import WAIT_S

SETTINGS = ScalingSettings(stable_window_seconds=2, panic_window_seconds=1, tick_seconds=0.05, fleet_sync_seconds=0.1,
                           lease_seconds=1.0, standby_worker=False, ecs_api_calls_per_second=50)




def ecs_client(moto_url: str):
    return boto3.client("ecs", region_name="us-east-1", endpoint_url=moto_url,
                        config=Config(retries={"mode": "standard", "total_max_attempts": 1}))


def spec(moto_url: str, name: str, service: str = SERVICE, **fields):
    return parse_endpoint({"name": name, "min_replicas": 0, "max_replicas": 3, "target_concurrency": 2,
                           "idle_seconds": 300, **fields,
                           "provisioner": {"kind": "ecs", "cluster": CLUSTER, "service": service,
                                           "region": "us-east-1", "endpoint_url": moto_url, "port": PORT}})


async def until(condition, what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not hold within {timeout} s")
        await asyncio.sleep(0.02)


async def test_a_deposed_owners_late_scale_up_adds_no_task(aws, moto_url, redis):
    """Owner A decides one task and stalls inside its write (its read of the count is held) past its lease;
    B takes over and asks for the one task the fleet's demand wants; then A's write goes on. Before issue #50
    it read B's count and wrote one more: demand 1 became 2 tasks."""
    ecs, _ = aws
    prefix, name = f"test-writes:{uuid.uuid4().hex[:8]}", f"org/late-{uuid.uuid4().hex[:6]}"
    stalled, release = threading.Event(), threading.Event()
    client_a, writes_a = ecs_client(moto_url), []
    armed = False

    def stall(**_) -> None:
        if armed:
            stalled.set()
            release.wait(WAIT_S)

    client_a.meta.events.register("before-call.ecs.DescribeServices", stall)
    client_a.meta.events.register("before-call.ecs.UpdateService", lambda **kw: writes_a.append(kw["params"]))
    controllers = []
    for gateway, client in (("a", client_a), ("b", ecs_client(moto_url))):
        endpoint = spec(moto_url, name)
        fleet = RedisFleet(redis.url, prefix=prefix, gateway_id=gateway, calls_per_second=50)
        controller = EndpointController(endpoint, EcsProvisioner(endpoint.provisioner, client=client),
                                        ReplicaRouter(), SETTINGS, fleet=fleet)
        await controller.start()
        controllers.append((controller, fleet))
        if gateway == "a":
            await until(lambda: controllers[0][0].adopted, "A adopting the service")
    (a, _), (b, _) = controllers
    waiting = []
    try:
        armed = True
        waiting.append(asyncio.create_task(a.activator.acquire(time.monotonic() + WAIT_S)))
        await until(stalled.is_set, "A's scale-up reaching ECS")
        waiting.append(asyncio.create_task(b.activator.acquire(time.monotonic() + WAIT_S)))
        await until(lambda: b.adopted and desired_count(ecs) == 1, "B taking over and asking for one task")
        release.set()  # A's stalled write goes on, long after its lease lapsed
        await until(lambda: not a.ownership.owner and not a._loop.done(), "A noticing it lost the lease")
        await asyncio.sleep(3 * SETTINGS.tick_seconds)
        assert desired_count(ecs) == 1 and writes_a == []
    finally:
        release.set()
        for task in waiting:
            task.cancel()
        for controller, fleet in controllers:
            await controller.drain_and_stop()
            await fleet.close()


async def test_a_write_goes_only_while_the_lease_holds_and_has_time_left(aws, moto_url, redis):
    ecs, _ = aws
    prefix = f"test-writes:{uuid.uuid4().hex[:8]}"
    first, second = (RedisFleet(redis.url, prefix=prefix, gateway_id=g, calls_per_second=50) for g in "ab")
    try:
        a, b = (Ownership(fleet, "m", sync_s=0.1, lease_s=4.0) for fleet in (first, second))
        await a.sync(time.monotonic(), Report(0.0))
        provisioner = EcsProvisioner(EcsProvisioning(cluster=CLUSTER, service=SERVICE, endpoint_url=moto_url))
        provisioner.fence = a.write_window
        await provisioner.open()
        await provisioner.add(1, target=1)
        assert desired_count(ecs) == 1
        await provisioner.add(1, target=1)  # the same target again (a retry, a late twin): nothing more
        assert desired_count(ecs) == 1
        # A stopped syncing: its lease holds for less than a write needs to land inside it; still A's, it is renewed
        while a.lease_left() > 0:
            await asyncio.sleep(0.02)
        assert await a.write_window() > a.lease_s - 2 * a.write_margin_s and a.owner
        await asyncio.sleep(a.lease_s + a.write_margin_s)  # the lease lapses
        await b.sync(time.monotonic(), Report(0.0))  # B owns the endpoint now
        assert b.owner
        with pytest.raises(FenceLost):
            await provisioner.add(1, target=2)
        assert not a.owner and desired_count(ecs) == 1
        provisioner.fence = b.write_window
        await provisioner.add(1, target=2)
        assert desired_count(ecs) == 2
    finally:
        await first.close()
        await second.close()


async def test_no_scale_in_before_the_tasks_were_listed_since_adoption(aws, moto_url):
    """A new owner that finishes a drain before it listed the tasks would protect none of them: ECS could then
    stop a serving task when the count drops."""
    ecs, network = aws
    ecs.update_service(cluster=CLUSTER, service=SERVICE, desiredCount=2)
    drained, serving = [t["taskArn"] for t in ecs.run_task(
        cluster=CLUSTER, taskDefinition=SERVICE, count=2, launchType="FARGATE", networkConfiguration=network,
        group=f"service:{SERVICE}")["tasks"]]
    provisioner = EcsProvisioner(EcsProvisioning(cluster=CLUSTER, service=SERVICE, endpoint_url=moto_url))
    await provisioner.open()
    with pytest.raises(ProvisionerBackoff):
        await provisioner.remove(drained)
    assert desired_count(ecs) == 2 and not _protected(ecs, serving)
    await provisioner.observe()
    await provisioner.remove(drained)
    assert desired_count(ecs) == 1 and _protected(ecs, serving)


async def test_idle_endpoints_cost_redis_little_per_gateway(aws, moto_url, redis, tmp_path):
    """Three gateways x four idle ECS endpoints: each (endpoint, gateway) pair makes a few Redis commands a
    second; before issue #50 every gateway synced every endpoint 4 times a second (about 28 commands a second)."""
    ecs, network = aws
    names = [f"org/idle-{uuid.uuid4().hex[:6]}" for _ in range(4)]
    services = {name: name.replace("org/", "svc-") for name in names}  # one ECS service per endpoint
    for service in services.values():
        ecs.create_service(cluster=CLUSTER, serviceName=service, taskDefinition=SERVICE, desiredCount=0,
                           launchType="FARGATE", networkConfiguration=network)
    settings = ScalingSettings(standby_worker=False)
    gateways = []
    try:
        for number in range(3):
            gateways.append(await Endpoints.open(f"sqlite:///{tmp_path}/g{number}.db",
                                                 [spec(moto_url, n, services[n]) for n in names], tmp_path, settings,
                                                 redis_url=redis.url))
            await gateways[-1].start()
        await until(lambda: all(any(g.controllers[n].adopted for g in gateways) for n in names), "every adoption")
        server = redis_client.Redis.from_url(redis.url)
        await asyncio.sleep(2 * settings.lease_seconds)  # the followers' first syncs are behind them
        before, started = server.info("stats")["total_commands_processed"], time.monotonic()
        await asyncio.sleep(2 * settings.lease_seconds)
        commands = server.info("stats")["total_commands_processed"] - before
        per_pair = commands / (time.monotonic() - started) / (len(names) * len(gateways))
        assert per_pair < 8, per_pair
        assert all(g.controllers[n].state == "scaled_to_zero" for g in gateways for n in names)
    finally:
        for gateway in gateways:
            await gateway.drain_and_stop()
        for service in services.values():
            ecs.delete_service(cluster=CLUSTER, service=service, force=True)


def _protected(ecs, arn: str) -> bool:
    answer = ecs.get_task_protection(cluster=CLUSTER, tasks=[arn])["protectedTasks"]
    return bool(answer) and answer[0]["protectionEnabled"]
