"""One ECS service per endpoint: its desired count is the endpoint's replica count, its tasks the replicas.

- `add` and `remove` move the service's desiredCount (`UpdateService`); `remove` also stops the task
  the controller drained (`StopTask`), so ECS does not pick a busy task to stop.
- `observe` lists the service's tasks (`ListTasks` + `DescribeTasks`, filtered on the task group
  `service:<name>` that ECS gives service tasks). A task's replica URL is its private IPv4 address
  (the awsvpc ENI attachment, which Fargate and awsvpc EC2 tasks have) and the configured container
  port; a task without one yet is a replica with no address. Tasks that stopped are reported as exits
  with their stop reason.
- At `open` the provisioner adopts the service's current desired count and tasks, so a gateway restart
  keeps the running workers. `close` leaves the service as it is.

Terraform creates the service (infra/terraform/modules/worker_pool, `ignore_changes = [desired_count]`);
the endpoint's `provisioner` table names it: `{kind = "ecs", cluster, service, region, port}`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import boto3
import structlog

from gateway.endpoints.provisioners.base import Observation, Provisioner, ReplicaAddress, ReplicaExit
from gateway.endpoints.spec import EcsProvisioning

log = structlog.get_logger(__name__)
DESCRIBE_LIMIT = 100  # tasks per DescribeTasks call
PENDING = "pending:"  # replica ids of tasks asked for but not yet listed


class EcsProvisionerError(RuntimeError):
    """The ECS service cannot be used (missing, or the API refused)."""


def direct_address(ip: str, port: int) -> str:
    return f"http://{ip}:{port}"


class EcsProvisioner(Provisioner):
    observe_interval_s = 1.0

    def __init__(self, settings: EcsProvisioning, *, resolve: Callable[[str, int], str] = direct_address,
                 client=None):
        """`resolve` maps a task's private address to the URL the gateway reaches it at: the address
        itself in a VPC; a test or a port-forwarded setup maps it to where the worker really listens."""
        self.settings = settings
        self.resolve = resolve
        self.client = client or boto3.client("ecs", region_name=settings.region,
                                             endpoint_url=settings.endpoint_url or None)
        self.desired = 0
        self._live: set[str] = set()  # task ARNs seen running or starting, to report each exit once

    async def open(self) -> None:
        service = await self._service()
        self.desired = service["desiredCount"]
        log.info("ecs_service_adopted", cluster=self.settings.cluster, service=self.settings.service,
                 desired=self.desired)

    async def observe(self) -> Observation:
        arns = await asyncio.to_thread(self._task_arns)
        tasks = await asyncio.to_thread(self._describe, sorted(set(arns) | self._live))
        replicas, exits = [], []
        for arn in self._live - {task["taskArn"] for task in tasks}:  # ECS forgot it: stopped long ago
            self._live.discard(arn)
            exits.append(ReplicaExit(arn, "the task no longer exists"))
        for task in tasks:
            arn = task["taskArn"]
            if task.get("group") != f"service:{self.settings.service}":
                continue
            if task.get("lastStatus") == "STOPPED" or task.get("desiredStatus") == "STOPPED":
                if arn in self._live:
                    self._live.discard(arn)
                    exits.append(ReplicaExit(arn, _stop_reason(task)))
                continue
            self._live.add(arn)
            ip = _private_ip(task) if task.get("lastStatus") == "RUNNING" else None
            replicas.append(ReplicaAddress(arn, self.resolve(ip, self.settings.port) if ip else None))
        # tasks ECS has yet to place: replicas without an address, so nobody asks for them twice
        replicas += [ReplicaAddress(f"{PENDING}{n}", None) for n in range(self.desired - len(replicas))]
        return Observation(replicas, exits)

    async def add(self, count: int) -> None:
        await self._set_desired(self.desired + count)

    async def remove(self, replica_id: str) -> None:
        await self._set_desired(max(0, self.desired - 1))
        if replica_id.startswith(PENDING):
            return
        self._live.discard(replica_id)
        await asyncio.to_thread(self.client.stop_task, cluster=self.settings.cluster, task=replica_id,
                                reason="drained and removed by the sluice autoscaler")

    async def _set_desired(self, count: int) -> None:
        await asyncio.to_thread(self.client.update_service, cluster=self.settings.cluster,
                                service=self.settings.service, desiredCount=count)
        log.info("ecs_desired_count", service=self.settings.service, desired=count, was=self.desired)
        self.desired = count

    async def _service(self) -> dict:
        answer = await asyncio.to_thread(self.client.describe_services, cluster=self.settings.cluster,
                                         services=[self.settings.service])
        found = [s for s in answer.get("services", []) if s.get("status") == "ACTIVE"]
        if not found:
            raise EcsProvisionerError(f"ECS service {self.settings.service!r} not found in cluster "
                                      f"{self.settings.cluster!r} ({self.settings.region}); create it first "
                                      "(infra/terraform/modules/worker_pool)")
        return found[0]

    def _task_arns(self) -> list[str]:
        arns: list[str] = []
        pages = self.client.get_paginator("list_tasks").paginate(
            cluster=self.settings.cluster, serviceName=self.settings.service, desiredStatus="RUNNING")
        for page in pages:
            arns.extend(page.get("taskArns", []))
        return arns

    def _describe(self, arns: list[str]) -> list[dict]:
        tasks = []
        for start in range(0, len(arns), DESCRIBE_LIMIT):
            answer = self.client.describe_tasks(cluster=self.settings.cluster, tasks=arns[start:start + DESCRIBE_LIMIT])
            tasks.extend(answer.get("tasks", []))
        return tasks


def _private_ip(task: dict) -> str | None:
    for attachment in task.get("attachments", []):
        if attachment.get("type") == "ElasticNetworkInterface":
            for detail in attachment.get("details", []):
                if detail.get("name") == "privateIPv4Address" and detail.get("value"):
                    return detail["value"]
    for container in task.get("containers", []):
        for interface in container.get("networkInterfaces", []):
            if interface.get("privateIpv4Address"):
                return interface["privateIpv4Address"]
    return None


def _stop_reason(task: dict) -> str:
    reasons = [task.get("stoppedReason") or "stopped"]
    for container in task.get("containers", []):
        if container.get("reason"):
            reasons.append(f"{container.get('name', 'container')}: {container['reason']}")
        elif container.get("exitCode") not in (None, 0):
            reasons.append(f"{container.get('name', 'container')} exited with {container['exitCode']}")
    return "; ".join(reasons)
