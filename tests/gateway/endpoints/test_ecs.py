"""The ECS provisioner against a real moto server (started here, on a free port).

moto keeps a service's desiredCount but runs no scheduler: its services start no tasks. So the test
plays ECS's service scheduler and agent (`PlayedEcs`): it keeps the service's running tasks at the
desiredCount through moto's own API (RunTask, StopTask), and for each task it starts a real worker
process on this machine. A task's address is moto's random private IP in the subnet, which nothing
here can reach, so the provisioner's documented `resolve` hook maps `ip:port` to the loopback URL of
that task's worker. Routing is proven by the worker id in the answer: the worker of the task that the
provisioner found through ListTasks / DescribeTasks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import boto3
import httpx
import pytest

from common.protocol import Done
from gateway.endpoints.errors import InvalidEndpoint
from gateway.endpoints.provisioners.ecs import PENDING, EcsProvisioner, EcsProvisionerError
from gateway.endpoints.service import Endpoints
from gateway.endpoints.spec import EcsProvisioning, parse_endpoint
from tests.fixtures.local_aws import moto_server
from tests.fixtures.servers import free_port
from tests.fixtures.sluice import REPO, pid_alive
from tests.fixtures.tiny_model import write_tiny_model
from tests.gateway.endpoints.helpers import FAST, complete, until

CLUSTER, SERVICE, PORT = "sluice", "tiny-llama", 8100


@pytest.fixture(scope="module")
def moto_url():
    with moto_server() as url:
        # moto moves a task one state towards STOPPED on every DescribeTasks unless told not to
        httpx.post(f"{url}/moto-api/state-manager/set-transition",
                   json={"model_name": "ecs::task", "transition": {"progression": "manual", "times": 10**9}}
                   ).raise_for_status()
        yield url


@pytest.fixture
def aws(moto_url, monkeypatch):
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    ecs = boto3.client("ecs", region_name="us-east-1", endpoint_url=moto_url)
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=moto_url)
    vpc = ec2.create_vpc(CidrBlock="10.40.0.0/16")["Vpc"]["VpcId"]
    ec2.modify_vpc_attribute(VpcId=vpc, EnableDnsHostnames={"Value": True})
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.40.1.0/24")["Subnet"]["SubnetId"]
    group = ec2.create_security_group(GroupName=f"workers-{vpc}", Description="workers", VpcId=vpc)["GroupId"]
    network = {"awsvpcConfiguration": {"subnets": [subnet], "securityGroups": [group]}}
    ecs.create_cluster(clusterName=CLUSTER)
    ecs.register_task_definition(family=SERVICE, networkMode="awsvpc", requiresCompatibilities=["FARGATE"],
                                 cpu="1024", memory="2048",
                                 containerDefinitions=[{"name": "worker", "image": "sluice-worker", "memory": 2048,
                                                        "portMappings": [{"containerPort": PORT}]}])
    ecs.create_service(cluster=CLUSTER, serviceName=SERVICE, taskDefinition=SERVICE, desiredCount=0,
                       launchType="FARGATE", networkConfiguration=network)
    yield ecs, network
    ecs.delete_service(cluster=CLUSTER, service=SERVICE, force=True)
    for arn in ecs.list_tasks(cluster=CLUSTER)["taskArns"]:
        ecs.stop_task(cluster=CLUSTER, task=arn, reason="test over")


class PlayedEcs:
    """ECS's service scheduler and agent, played: running tasks follow desiredCount, each task runs a
    real worker, and `resolve` maps a task's private address to its worker's loopback URL."""

    def __init__(self, ecs, network: dict, model_dir: Path, data_dir: Path):
        self.ecs, self.network, self.model_dir, self.data_dir = ecs, network, model_dir, data_dir
        self.desired_seen: list[int] = []
        self.urls: dict[str, str] = {}  # "ip:port" -> worker URL
        self.workers: dict[str, subprocess.Popen] = {}  # task ARN -> its worker
        self.worker_ids: dict[str, str] = {}  # task ARN -> the worker id it answers with
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def resolve(self, ip: str, port: int) -> str:
        return self.urls[f"{ip}:{port}"]

    def __enter__(self) -> PlayedEcs:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for process in self.workers.values():
            process.kill()
            process.wait()

    def _run(self) -> None:
        while not self._stop.is_set():
            desired = self.ecs.describe_services(cluster=CLUSTER, services=[SERVICE])["services"][0]["desiredCount"]
            if not self.desired_seen or self.desired_seen[-1] != desired:
                self.desired_seen.append(desired)
            running = self._tasks("RUNNING")
            for task in running[desired:]:  # ECS stops the surplus (the provisioner stopped the drained one)
                self.ecs.stop_task(cluster=CLUSTER, task=task["taskArn"], reason="scaled in")
            if len(running) < desired:
                started = self.ecs.run_task(cluster=CLUSTER, taskDefinition=SERVICE, count=desired - len(running),
                                            launchType="FARGATE", networkConfiguration=self.network,
                                            group=f"service:{SERVICE}", startedBy="ecs-svc/played")["tasks"]
                for task in started:
                    self._start_worker(task)
            for task in self._tasks("STOPPED"):
                process = self.workers.pop(task["taskArn"], None)
                if process is not None:
                    process.terminate()
            time.sleep(0.1)

    def _tasks(self, status: str) -> list[dict]:
        arns = self.ecs.list_tasks(cluster=CLUSTER, desiredStatus=status)["taskArns"]
        if not arns:
            return []
        return [t for t in self.ecs.describe_tasks(cluster=CLUSTER, tasks=arns)["tasks"]
                if t.get("group") == f"service:{SERVICE}"]

    def _start_worker(self, task: dict) -> None:
        ip = private_ip(task)
        port = free_port()
        worker_id = f"task-{task['taskArn'].rsplit('/', 1)[-1][:8]}"
        model = {"name": "tiny/llama", "source": str(self.model_dir), "threads": 1, "decode_threads": 1,
                 "max_batch_size": 8, "max_context": 256}
        self.workers[task["taskArn"]] = subprocess.Popen(
            [sys.executable, "-m", "worker", "--model-json", json.dumps(model), "--port", str(port),
             "--data-dir", str(self.data_dir), "--worker-id", worker_id], cwd=REPO,
            env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
        self.worker_ids[task["taskArn"]] = worker_id
        self.urls[f"{ip}:{PORT}"] = f"http://127.0.0.1:{port}"


def ecs_spec(moto_url: str, **fields):
    return parse_endpoint({"name": "tiny/llama", "min_replicas": 0, "max_replicas": 2, "idle_seconds": 1,
                           "provisioner": {"kind": "ecs", "cluster": CLUSTER, "service": SERVICE,
                                           "region": "us-east-1", "endpoint_url": moto_url, "port": PORT},
                           **fields})


def private_ip(task: dict) -> str:
    return next(d["value"] for a in task["attachments"] for d in a["details"] if d["name"] == "privateIPv4Address")


def desired_count(ecs) -> int:
    return ecs.describe_services(cluster=CLUSTER, services=[SERVICE])["services"][0]["desiredCount"]


@pytest.mark.slow
async def test_desired_count_follows_the_autoscaler_and_requests_reach_the_tasks_workers(aws, moto_url, tmp_path):
    ecs, network = aws
    model_dir = write_tiny_model(tmp_path / "tiny")
    with PlayedEcs(ecs, network, model_dir, tmp_path) as played:
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
            worker = played.workers[task_arn]
            await until(lambda: endpoint.state == "scaled_to_zero", 60, "the idle scale-in")
            await until(lambda: desired_count(ecs) == 0 and not played.workers, 30, "the task's stop")
            stopped = ecs.describe_tasks(cluster=CLUSTER, tasks=[task_arn])["tasks"][0]
            assert stopped["lastStatus"] == "STOPPED" and "sluice" in stopped["stoppedReason"]
            await until(lambda: not pid_alive(worker.pid), 30, "the worker's exit")
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

