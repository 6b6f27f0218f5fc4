"""The ECS provisioner against a real moto server (started here, on a free port).

moto keeps a service's desiredCount but runs no scheduler: its services start no tasks. So the test
plays ECS's service scheduler and agent (`PlayedEcs`, testkit/played_ecs.py): it keeps the service's
running tasks at the desiredCount through moto's own API (RunTask, StopTask), and for each task it starts a
real worker process on this machine. A task's address is moto's random private IP in the subnet, which nothing
here can reach, so the provisioner's documented `resolve` hook maps `ip:port` to the loopback URL of
that task's worker. Routing is proven by the worker id in the answer: the worker of the task that the
provisioner found through ListTasks / DescribeTasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import boto3
import pytest

from common.protocol import Done
from gateway.endpoints.errors import InvalidEndpoint
from gateway.endpoints.fleet import RedisFleet
from gateway.endpoints.provisioners.base import ProvisionerBackoff
from gateway.endpoints.provisioners.ecs import PENDING, PROTECT_MINUTES, EcsProvisioner, EcsProvisionerError
from gateway.endpoints.service import Endpoints
from gateway.endpoints.spec import EcsProvisioning, parse_endpoint
from testkit.played_ecs import (
    CLUSTER,
    PORT,
    SERVICE,
    PlayedEcs,
    TaskWorker,
    desired_count,
    private_ip,
    protocol_task,
)
from testkit.protocol_worker import MODEL
from testkit.servers import free_port
from testkit.sluice import REPO, pid_alive
from testkit.tiny_model import write_tiny_model
from tests.gateway.endpoints.helpers import FAST, START_S, complete, until


def worker_process(model_dir: Path, data_dir: Path):
    """What the played agent runs for a task: a real worker process serving the tiny model."""

    def start(task: dict) -> TaskWorker:
        port = free_port()
        worker_id = f"task-{task['taskArn'].rsplit('/', 1)[-1][:8]}"
        model = {"name": "tiny/llama", "source": str(model_dir), "threads": 1, "decode_threads": 1,
                 "max_batch_size": 8, "max_context": 256}
        process = subprocess.Popen(
            [sys.executable, "-m", "worker", "--model-json", json.dumps(model), "--port", str(port),
             "--data-dir", str(data_dir), "--worker-id", worker_id], cwd=REPO,
            env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})

        def stop(wait: bool) -> None:
            if wait:
                process.kill()
                process.wait()
            else:
                process.terminate()

        return TaskWorker(f"http://127.0.0.1:{port}", worker_id, stop, process)

    return start


def ecs_spec(moto_url: str, **fields):
    return parse_endpoint({"name": "tiny/llama", "min_replicas": 0, "max_replicas": 2, "idle_seconds": 1,
                           "provisioner": {"kind": "ecs", "cluster": CLUSTER, "service": SERVICE,
                                           "region": "us-east-1", "endpoint_url": moto_url, "port": PORT},
                           **fields})


@pytest.mark.slow
async def test_desired_count_follows_the_autoscaler_and_requests_reach_the_tasks_workers(aws, moto_url, tmp_path):
    ecs, network = aws
    model_dir = write_tiny_model(tmp_path / "tiny")
    with PlayedEcs(ecs, network, worker_process(model_dir, tmp_path)) as played:
        endpoints = await Endpoints.open(f"sqlite:///{tmp_path}/sluice.db", [ecs_spec(moto_url)], tmp_path, FAST,
                                         provisioners=lambda spec: EcsProvisioner(spec.provisioner,
                                                                                  resolve=played.resolve))
        await endpoints.start()
        endpoint = endpoints.resolve("tiny/llama", None)
        try:
            assert endpoint.state == "scaled_to_zero" and desired_count(ecs) == 0
            events, lease = await complete(endpoints, endpoint, 0)  # wakes the endpoint through ECS
            assert isinstance(events[-1], Done) and lease.cold_start_ms > 0
            (task_arn,) = played.workers
            assert events[-1].worker_id == played.worker_ids[task_arn]  # served by that task's worker
            assert lease.replica.replica_id == task_arn and desired_count(ecs) == 1
            worker = played.workers[task_arn].handle
            await until(lambda: endpoint.state == "scaled_to_zero", 60, "the idle scale-in")
            await until(lambda: desired_count(ecs) == 0 and not played.workers, START_S, "the task's stop")
            stopped = ecs.describe_tasks(cluster=CLUSTER, tasks=[task_arn])["tasks"][0]
            assert stopped["lastStatus"] == "STOPPED" and "sluice" in stopped["stoppedReason"]
            await until(lambda: not pid_alive(worker.pid), START_S, "the worker's exit")
            assert played.desired_seen == [0, 1, 0]
        finally:
            await endpoints.drain_and_stop()


async def test_add_remove_and_observe_move_the_service_and_read_its_tasks(aws, moto_url):
    ecs, network = aws
    provisioner = EcsProvisioner(EcsProvisioning(cluster=CLUSTER, service=SERVICE, endpoint_url=moto_url),
                                 resolve=lambda ip, port: f"http://resolved-{ip}:{port}")
    await provisioner.open()
    assert provisioner.desired == 0 and (await provisioner.observe()).replicas == []
    await provisioner.add(2)
    assert desired_count(ecs) == 2
    pending = (await provisioner.observe()).replicas  # ECS has placed nothing yet
    assert [r.replica_id for r in pending] == [f"{PENDING}0", f"{PENDING}1"] and all(r.url is None for r in pending)
    tasks = ecs.run_task(cluster=CLUSTER, taskDefinition=SERVICE, count=2, launchType="FARGATE",
                         networkConfiguration=network, group=f"service:{SERVICE}")["tasks"]
    ecs.run_task(cluster=CLUSTER, taskDefinition=SERVICE, count=1, launchType="FARGATE",
                 networkConfiguration=network, group="service:another")  # not ours
    seen = {r.replica_id: r.url for r in (await provisioner.observe()).replicas}
    assert seen == {t["taskArn"]: f"http://resolved-{private_ip(t)}:{PORT}" for t in tasks}
    await provisioner.remove(tasks[0]["taskArn"])
    assert desired_count(ecs) == 1
    stopped = ecs.describe_tasks(cluster=CLUSTER, tasks=[tasks[0]["taskArn"]])["tasks"][0]
    assert stopped["lastStatus"] == "STOPPED"
    observation = await provisioner.observe()
    assert [r.replica_id for r in observation.replicas] == [tasks[1]["taskArn"]] and observation.exits == []
    ecs.stop_task(cluster=CLUSTER, task=tasks[1]["taskArn"], reason="Essential container in task exited")
    observation = await provisioner.observe()
    assert [e.replica_id for e in observation.exits] == [tasks[1]["taskArn"]]
    assert "Essential container" in observation.exits[0].reason

    adopted = EcsProvisioner(EcsProvisioning(cluster=CLUSTER, service=SERVICE, endpoint_url=moto_url))
    await adopted.open()  # a restarted gateway takes the service as it is
    assert adopted.desired == 1


async def test_scale_in_protects_every_kept_task_so_ecs_stops_only_the_drained_one(aws, moto_url):
    """ECS acts between UpdateService and StopTask: the client pauses after UpdateService until the played
    scheduler (no grace) has seen the lower count, and that scheduler would pick the last listed task. The
    provisioner drains the first listed one; the protection it set first leaves ECS no other choice."""
    ecs, network = aws
    client = boto3.client("ecs", region_name="us-east-1", endpoint_url=moto_url)
    with PlayedEcs(ecs, network, lambda task: TaskWorker("http://unused", task["taskArn"], lambda wait: None),
                   surplus_grace_s=0) as played:
        def after_update_service(**_) -> None:  # ECS's scheduler gets its moment between the two calls
            seen = len(played.desired_seen)
            deadline = time.monotonic() + START_S
            while len(played.desired_seen) == seen and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)  # a few more of its passes

        client.meta.events.register("after-call.ecs.UpdateService", after_update_service)
        provisioner = EcsProvisioner(EcsProvisioning(cluster=CLUSTER, service=SERVICE, endpoint_url=moto_url),
                                     resolve=played.resolve, client=client)
        await provisioner.open()
        await provisioner.add(2)
        await until(lambda: len(played.workers) == 2, START_S, "two running tasks")
        assert all(r.url for r in (await provisioner.observe()).replicas)
        listed = ecs.list_tasks(cluster=CLUSTER, desiredStatus="RUNNING")["taskArns"]
        drained, busy = listed[0], listed[-1]
        await provisioner.remove(drained)
        await until(lambda: set(played.workers) == {busy}, START_S, "the drained task's stop")
        await asyncio.sleep(0.5)  # the scheduler's next passes change nothing
        assert set(played.workers) == {busy} and sorted(played.started) == sorted(listed)
        assert desired_count(ecs) == 1
        states = {t["taskArn"]: t["lastStatus"] for t in ecs.describe_tasks(cluster=CLUSTER, tasks=listed)["tasks"]}
        assert states == {drained: "STOPPED", busy: "RUNNING"}
        protection = ecs.get_task_protection(cluster=CLUSTER, tasks=[busy])["protectedTasks"][0]
        assert protection["protectionEnabled"] and protection["expirationDate"] <= (
            datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=PROTECT_MINUTES))


async def test_a_missing_service_is_a_clear_error_and_creates_nothing(aws, moto_url, tmp_path):
    provisioner = EcsProvisioner(EcsProvisioning(cluster=CLUSTER, service="absent", endpoint_url=moto_url))
    with pytest.raises(EcsProvisionerError, match="'absent' not found in cluster 'sluice'"):
        await provisioner.open()
    endpoints = await Endpoints.open(f"sqlite:///{tmp_path}/sluice.db", [], tmp_path, FAST)
    await endpoints.start()
    try:
        body = {"name": "org/absent", "min_replicas": 0,
                "provisioner": {"kind": "ecs", "cluster": CLUSTER, "service": "absent", "endpoint_url": moto_url}}
        with pytest.raises(InvalidEndpoint, match="cannot start.*not found"):
            await endpoints.create(body)
        assert endpoints.list() == [] and await endpoints.store.rows() == []
    finally:
        await endpoints.drain_and_stop()



async def test_a_budget_the_shared_state_cannot_count_is_a_backoff_not_the_services_failure(aws, moto_url):
    """Redis away: each call's budget slot cannot be counted. That is a backoff (the controller tries again); as
    an error it failed every endpoint not yet adopted when Redis went (issue #50, tests/fleet/test_fleet_outage.py)."""
    fleet = RedisFleet(f"redis://127.0.0.1:{free_port()}/0", timeout=0.5)  # nothing listens there
    provisioner = EcsProvisioner(EcsProvisioning(cluster=CLUSTER, service=SERVICE, endpoint_url=moto_url),
                                 budget=fleet.take_call)
    try:
        for call in (provisioner.open, provisioner.observe):
            with pytest.raises(ProvisionerBackoff, match="budget cannot be read") as raised:
                await call()
            assert raised.value.retry_in > 0
    finally:
        await fleet.close()


async def test_two_removals_at_once_each_lower_the_count(aws, moto_url):
    """Two drains that end together each take one off the count: the second reads it after the first wrote. The
    client holds every DescribeServices until a second one comes (or 2 s pass): read-then-write moves that
    overlapped would both read 3 and both write 2, and ECS would start a task to replace the lost step."""
    ecs, network = aws
    client = boto3.client("ecs", region_name="us-east-1", endpoint_url=moto_url)
    provisioner = EcsProvisioner(EcsProvisioning(cluster=CLUSTER, service=SERVICE, endpoint_url=moto_url),
                                 client=client)
    await provisioner.open()
    await provisioner.add(3)
    tasks = [t["taskArn"] for t in ecs.run_task(cluster=CLUSTER, taskDefinition=SERVICE, count=3, launchType="FARGATE",
                                                networkConfiguration=network, group=f"service:{SERVICE}")["tasks"]]
    await provisioner.observe()
    together = threading.Barrier(2)

    def after_describe_services(**_) -> None:
        with contextlib.suppress(threading.BrokenBarrierError):
            together.wait(timeout=2)
        together.reset()

    client.meta.events.register("after-call.ecs.DescribeServices", after_describe_services)
    await asyncio.gather(provisioner.remove(tasks[0]), provisioner.remove(tasks[1]))
    assert desired_count(ecs) == 1


async def test_a_task_the_address_map_does_not_list_yet_has_no_address_yet(aws, moto_url, tmp_path):
    """The played scheduler lists a task's worker in the test-only address map a moment after ECS shows the task
    running: until then the task has no address (it is looked at again), never its unreachable private one."""
    ecs, network = aws
    address_map = tmp_path / "addresses.json"
    address_map.write_text("{}")
    provisioner = EcsProvisioner(EcsProvisioning(cluster=CLUSTER, service=SERVICE, endpoint_url=moto_url,
                                                 test_address_map=str(address_map)))
    await provisioner.open()
    await provisioner.add(1)
    task = ecs.run_task(cluster=CLUSTER, taskDefinition=SERVICE, count=1, launchType="FARGATE",
                        networkConfiguration=network, group=f"service:{SERVICE}")["tasks"][0]
    assert [(r.replica_id, r.url) for r in (await provisioner.observe()).replicas] == [(task["taskArn"], None)]
    address_map.write_text(json.dumps({f"{private_ip(task)}:{PORT}": "http://127.0.0.1:9"}))
    assert [r.url for r in (await provisioner.observe()).replicas] == ["http://127.0.0.1:9"]
    await provisioner.remove(task["taskArn"])


async def test_a_task_starting_is_looked_at_every_second_whatever_the_steady_pace(aws, moto_url, tmp_path):
    """An owner of many ECS endpoints lists each one's tasks rarely (100 endpoints at 2 calls/s: every 200 s,
    service.py `_pace_discovery`), and every second while a task waits for its address. The next look was timed
    before the look whose answer showed the task starting: a cold start at that scale waited for the steady look
    (up to 200 s) to learn its task's address."""
    ecs, network = aws
    addressed: list[bool] = []  # the played tasks' addresses are known from now on
    with PlayedEcs(ecs, network, protocol_task) as played:
        endpoints = await Endpoints.open(f"sqlite:///{tmp_path}/sluice.db",
                                         [ecs_spec(moto_url, name=MODEL, min_replicas=1)], tmp_path, FAST,
                                         provisioners=lambda spec: EcsProvisioner(
                                             spec.provisioner,
                                             resolve=lambda ip, port: played.urls.get(f"{ip}:{port}") if addressed
                                             else None))
        await endpoints.start()
        endpoint = endpoints.resolve(MODEL, None)
        endpoint.provisioner.steady_interval_s = 3600.0  # the pace of a fleet far larger than this test's
        try:
            await until(lambda: played.workers and set(played.workers) <= set(endpoint.members), START_S,
                        "the task listed, without its address")
            addressed.append(True)
            await until(lambda: endpoint.state == "ready", 60, "the task's replica")
        finally:
            await endpoints.drain_and_stop()


def played_address(played: PlayedEcs):
    """The address of a played task's worker, none while the played agent has not started it yet."""
    return lambda ip, port: played.urls.get(f"{ip}:{port}")


async def test_a_serving_task_that_stops_is_replaced_long_before_the_steady_look(aws, moto_url, tmp_path):
    """An owner of many ECS endpoints lists each one's tasks rarely (100 endpoints at 2 calls/s: every 200 s,
    service.py `_pace_discovery`). A serving task that stops (its host lost, its worker crashed) is ejected by the
    health polls at once, but the task ECS starts in its place was found only at that steady look: the endpoint had
    no replica meanwhile, and its stopped task still counted as one. A serving replica gone down brings the look
    forward."""
    ecs, network = aws
    with PlayedEcs(ecs, network, protocol_task) as played:
        endpoints = await Endpoints.open(f"sqlite:///{tmp_path}/sluice.db",
                                         [ecs_spec(moto_url, name=MODEL, min_replicas=1)], tmp_path, FAST,
                                         provisioners=lambda spec: EcsProvisioner(
                                             spec.provisioner, resolve=played_address(played)))
        await endpoints.start()
        endpoint = endpoints.resolve(MODEL, None)
        endpoint.provisioner.steady_interval_s = 3600.0  # the pace of a fleet far larger than this test's
        try:
            await until(lambda: endpoint.state == "ready", START_S, "the first task's replica")
            (first,) = played.workers
            ecs.stop_task(cluster=CLUSTER, task=first, reason="the host was lost")
            await until(lambda: len(played.started) == 2, START_S, "ECS's replacement task")
            await until(lambda: any(m.replica is not None and m.replica.healthy and m.replica_id == played.started[1]
                                    for m in endpoint.members.values()), 60, "the replacement's replica")
            assert first not in endpoint.members and desired_count(ecs) == 1
        finally:
            await endpoints.drain_and_stop()


async def test_a_serving_task_that_hangs_makes_a_bounded_number_of_extra_looks(aws, moto_url, tmp_path):
    """The other side of the early look: a task whose worker stopped answering but which ECS keeps running is
    looked at every 5 s only for two minutes after it went down, then at the steady pace again, so a hung worker
    does not spend the fleet's ECS budget for good. Once the replica is down, the controller's clock runs 60 times
    faster than the wall's."""
    ecs, network = aws
    fast_since: list[float] = []  # when the controller's clock began to run fast
    made: list[int] = []

    def clock() -> float:
        now = time.monotonic()
        return fast_since[0] + (now - fast_since[0]) * 60 if fast_since else now

    async def counted(scope: str, calls: int) -> float:  # the fleet's budget, counting every call it admits
        made.append(calls)
        return 0.0

    with PlayedEcs(ecs, network, protocol_task) as played:
        endpoints = await Endpoints.open(f"sqlite:///{tmp_path}/sluice.db",
                                         [ecs_spec(moto_url, name=MODEL, min_replicas=1)], tmp_path, FAST,
                                         provisioners=lambda spec: EcsProvisioner(
                                             spec.provisioner, budget=counted,
                                             resolve=played_address(played)))
        endpoints.clock = clock
        await endpoints.start()
        endpoint = endpoints.resolve(MODEL, None)
        endpoint.provisioner.steady_interval_s = 3600.0
        try:
            await until(lambda: endpoint.state == "ready", START_S, "the first task's replica")
            (first,) = played.workers
            played.workers[first].stop(True)  # the worker is gone, its task still RUNNING for ECS
            await until(lambda: not endpoint.members[first].replica.healthy, 60, "the replica polled down")
            fast_since.append(time.monotonic())
            down, before = clock(), sum(made)
            await until(lambda: endpoints.clock() > down + 150, 60, "two and a half minutes on the controller")
            early = sum(made)
            assert early - before >= 4  # looked again (ListTasks + DescribeTasks) while it was newly down
            await until(lambda: endpoints.clock() > down + 750, 60, "ten minutes more")
            assert sum(made) == early  # no look in those ten minutes: the steady pace (an hour here) again
            assert first in endpoint.members and desired_count(ecs) == 1
        finally:
            await endpoints.drain_and_stop()
