"""One ECS service per endpoint: its desired count is the endpoint's replica count, its tasks the replicas.

- `add` raises the service's desiredCount to an absolute target, the controller's decision (`UpdateService`),
  never lowering what ECS reports at that moment (`DescribeServices` first) and writing nothing when the count
  is there already: a repeated or late add asks for the same tasks, never one more. `remove` lowers the count
  by one from the count ECS reports. Only the endpoint's owner calls them, and every write (`UpdateService`,
  `StopTask`, `UpdateTaskProtection`) is preceded, after its budget slot and its read, immediately by the
  fencing check (`fence`, ownership.py `write_window`): a gateway that lost the lease, or holds too little of
  it for the write to land inside it, writes nothing (`FenceLost`).
- `remove` scales in without letting ECS choose: it first puts every other task of the service under
  task scale-in protection (`UpdateTaskProtection`, 10 tasks a call, for `PROTECT_MINUTES`), then lowers
  desiredCount and at once stops the task the controller drained (`StopTask`, which protection does not
  guard). ECS never stops a protected task when the count drops, so in the moment between the two calls
  it can only stop the drained one (or a task too new to carry work); were StopTask lost, ECS would
  still converge on that one. The protection simply lapses: it outlives the scale-in by a minute at most.
  No scale-in before the first `observe` since `open`: the tasks to protect are the ones it lists.
- `observe` lists the service's tasks (`ListTasks` + `DescribeTasks`, filtered on the task group
  `service:<name>` that ECS gives service tasks). A task's replica URL is its private IPv4 address
  (the awsvpc ENI attachment, which Fargate and awsvpc EC2 tasks have) and the configured container
  port; a task without one yet is a replica with no address. Tasks that stopped are reported as exits
  with their stop reason.
- Every call takes a slot of the fleet's ECS API budget (`budget`, fleet.py) first, and a throttled call
  (ThrottlingException and its kin) backs off exponentially (0.5 s doubling to 30 s, with jitter): the
  call raises `ProvisionerBackoff` and the controller tries again later. botocore's own retries are off, so
  every call on the wire is one the budget counted. A budget that cannot be read (the shared state away) is a
  `ProvisionerBackoff` too: no call goes, and nothing is taken for the service's failure.
- `observe_interval_s` paces discovery: 1 s while a task has no address yet, `steady_interval_s` (set from
  the number of ECS endpoints and the budget by service.py) otherwise.
- At `open` the provisioner adopts the service's current desired count and tasks, so a gateway restart
  or a new owner keeps the running workers. `close` leaves the service as it is.

Terraform creates the service (infra/terraform/modules/worker_pool, `ignore_changes = [desired_count]`);
the endpoint's `provisioner` table names it: `{kind = "ecs", cluster, service, region, port}`.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import threading
import time
from collections.abc import Awaitable, Callable

import boto3
import structlog
from botocore.awsrequest import AWSResponse
from botocore.config import Config
from botocore.exceptions import ClientError

from gateway.endpoints.provisioners.base import (
    FenceLost,
    Observation,
    Provisioner,
    ProvisionerBackoff,
    ReplicaAddress,
    ReplicaExit,
)
from gateway.endpoints.scaling import SCALE_IN_CALLS
from gateway.endpoints.spec import EcsProvisioning

log = structlog.get_logger(__name__)
DESCRIBE_LIMIT = 100  # tasks per DescribeTasks call
PENDING = "pending:"  # replica ids of tasks asked for but not yet listed
THROTTLED = {"ThrottlingException", "Throttling", "TooManyRequestsException", "RequestLimitExceeded"}
BACKOFF_FIRST_S, BACKOFF_MAX_S = 0.5, 30.0
BUSY_OBSERVE_S = 1.0  # discovery pace while a task waits for an address
BUDGET_WAIT_MAX_S = 5.0  # a call waits this long at most for a slot of the API budget, then backs off
SHARED_STATE_RETRY_S = 1.0  # a budget the fleet's shared state cannot count (Redis or PostgreSQL away): retry
PROTECT_MINUTES = 1  # scale-in protection of the tasks a scale-in keeps: ECS's shortest (1 to 2,880)
PROTECT_LIMIT = 10  # tasks per UpdateTaskProtection call
CONNECT_TIMEOUT_S = 1.0  # a write that cannot connect by then is dropped: it must land inside the lease
MAX_CONNECTIONS = 10  # of a shared client (botocore's default): the fleet's budget allows a few calls a second
_CLIENTS: dict[tuple, object] = {}
_CLIENTS_LOCK = threading.Lock()


class EcsProvisionerError(RuntimeError):
    """The ECS service cannot be used (missing, or the API refused)."""


def direct_address(ip: str, port: int) -> str:
    return f"http://{ip}:{port}"


def mapped_address(path: str) -> Callable[[str, int], str | None]:
    """Test-only (`test_address_map`): the URL the JSON file at `path` gives for "ip:port", read at each call;
    None (no address yet: looked at again soon) while the file does not list it. The played scheduler lists a
    task's worker once it runs, a moment after ECS shows the task: the task's own private address then, kept
    for good, was a replica nobody could reach (starting until `ecs_start_timeout_seconds`)."""

    def resolve(ip: str, port: int) -> str | None:
        with open(path) as file:
            return json.load(file).get(f"{ip}:{port}")

    return resolve


def shared_client(settings: EcsProvisioning):
    """One ECS client per region, endpoint URL (and test-only throttle file), made once: a client costs ~0.1 s of
    CPU (botocore loads the service model), which a gateway with 100 ECS endpoints paid 100 times before it
    listened. Clients are thread-safe; botocore's default session, which makes them, is not (hence the lock)."""
    key = (settings.region, settings.endpoint_url, settings.test_throttle_file)
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            client = _CLIENTS[key] = boto3.client(
                "ecs", region_name=settings.region, endpoint_url=settings.endpoint_url or None,
                config=Config(retries={"mode": "standard", "total_max_attempts": 1}, connect_timeout=CONNECT_TIMEOUT_S,
                              max_pool_connections=MAX_CONNECTIONS))
            if settings.test_throttle_file:
                inject_throttling(client, settings.test_throttle_file)
        return client


def inject_throttling(client, path: str) -> None:
    """Test-only (`test_throttle_file`): while the file at `path` exists, every ECS call is answered with a
    ThrottlingException before it leaves (botocore's before-call event), as AWS answers a fleet over its rate."""

    def throttle(**_) -> tuple[AWSResponse, dict] | None:
        if not os.path.exists(path):
            return None
        error = {"Code": "ThrottlingException", "Message": "Rate exceeded (injected: test_throttle_file exists)"}
        return AWSResponse("", 400, {}, None), {"Error": error, "ResponseMetadata": {"HTTPStatusCode": 400}}

    client.meta.events.register("before-call.ecs", throttle)


class EcsProvisioner(Provisioner):
    shared = True

    def __init__(self, settings: EcsProvisioning, *, resolve: Callable[[str, int], str | None] | None = None,
                 client=None, budget: Callable[[str, int], Awaitable[float]] | None = None):
        """`resolve` maps a task's private address to the URL the gateway reaches it at: the address
        itself in a VPC; a test or a port-forwarded setup maps it to where the worker really listens (None: not
        reachable yet, looked at again soon).
        `budget(scope)`: 0 when an API call may go now, else seconds to wait (fleet.py `take_call`)."""
        self.settings = settings
        if resolve is None:
            resolve = mapped_address(settings.test_address_map) if settings.test_address_map else direct_address
        self.resolve = resolve
        self.client = client  # None: the shared one of its region, made at the first call (shared_client)
        self.budget = budget
        # seconds a write started now lands inside this gateway's lease (0: not ours); None: no fleet to ask
        self.fence: Callable[[], Awaitable[float]] | None = None
        self.steady_interval_s = 1.0
        self.desired = 0
        self._live: set[str] = set()  # task ARNs seen running or starting, to report each exit once
        self._observed = False  # the tasks were listed since `open`: a scale-in knows which ones to protect
        self._unaddressed = False  # a task (or a placeholder) waits for an address: look again soon
        self._backoff_s = 0.0
        self._not_before = 0.0  # monotonic: no call before this (backing off after throttling)
        # one count move at a time: two drains that each read the count before either wrote would lose a step
        self._moving = asyncio.Lock()

    @property
    def observe_interval_s(self) -> float:
        return BUSY_OBSERVE_S if self._unaddressed else self.steady_interval_s

    async def open(self) -> None:
        service = await self._service()
        self._observed = False
        self.desired = service["desiredCount"]
        log.info("ecs_service_adopted", cluster=self.settings.cluster, service=self.settings.service,
                 desired=self.desired)

    async def observe(self) -> Observation:
        arns = await self._task_arns()
        tasks = await self._describe(sorted(set(arns) | self._live))
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
        self._unaddressed = any(r.url is None for r in replicas)
        self._observed = True
        return Observation(replicas, exits)

    async def add(self, count: int, *, target: int | None = None) -> None:
        async with self._moving:  # one count move at a time (read, then write)
            current = (await self._service())["desiredCount"]
            wanted = max(current, target) if target is not None else current + count
            if wanted == current:  # asked for already (by this call's twin, or the count it read is newer)
                self.desired = current
                return
            await self._write_count(wanted, current)

    async def remove(self, replica_id: str) -> None:
        if not self._observed:  # the tasks to protect are not known yet: ECS could pick a serving one
            raise ProvisionerBackoff("no look at the service's tasks since it was adopted", BUSY_OBSERVE_S)
        task = None if replica_id.startswith(PENDING) else replica_id
        async with self._moving:
            await self._scale_in(task)
        if task is not None:
            self._live.discard(task)

    async def _scale_in(self, stop: str | None) -> None:
        """desiredCount = what ECS says it is now - 1 (never below 0). Every task but `stop` is protected first
        (a slot of the budget per call), then the count is lowered and the drained task `stop` stopped at once
        (both calls in one take of the budget: nothing waits between them)."""
        current = (await self._service())["desiredCount"]
        count = max(0, current - 1)
        keep = sorted(self._live - {stop}) if count < current else []
        for start in range(0, len(keep), PROTECT_LIMIT):
            await self._call("update_task_protection", fenced=True, cluster=self.settings.cluster,
                             tasks=keep[start:start + PROTECT_LIMIT], protectionEnabled=True,
                             expiresInMinutes=PROTECT_MINUTES)
        await self._write_count(count, current, stop)

    async def _write_count(self, count: int, current: int, stop: str | None = None) -> None:
        await self._take(SCALE_IN_CALLS if stop else 1)
        await self._call("update_service", budgeted=False, fenced=True, cluster=self.settings.cluster,
                         service=self.settings.service, desiredCount=count)
        log.info("ecs_desired_count", service=self.settings.service, desired=count, was=current)
        self.desired = count
        if stop is not None:
            await self._call("stop_task", budgeted=False, fenced=True, cluster=self.settings.cluster,
                             task=stop, reason="drained and removed by the sluice autoscaler")

    async def _service(self) -> dict:
        answer = await self._call("describe_services", cluster=self.settings.cluster,
                                  services=[self.settings.service])
        found = [s for s in answer.get("services", []) if s.get("status") == "ACTIVE"]
        if not found:
            raise EcsProvisionerError(f"ECS service {self.settings.service!r} not found in cluster "
                                      f"{self.settings.cluster!r} ({self.settings.region}); create it first "
                                      "(infra/terraform/modules/worker_pool)")
        return found[0]

    async def _take(self, calls: int) -> None:
        """Wait for `calls` slots of the fleet's ECS API budget, after any backoff."""
        wait = self._not_before - time.monotonic()
        if wait > 0:
            raise ProvisionerBackoff(f"ECS throttled us; backing off {wait:.1f} s", wait)
        if self.budget is None:
            return
        waited = 0.0
        while (pause := await self._budget_pause(calls)) > 0:
            if waited >= BUDGET_WAIT_MAX_S:
                raise ProvisionerBackoff("the fleet's ECS API budget is spent", pause)
            await asyncio.sleep(pause)
            waited += pause

    async def _budget_pause(self, calls: int) -> float:
        try:
            return await self.budget(f"ecs:{self.settings.region}", calls)
        except Exception as error:
            # the shared state is away (its outage is logged by the fleet's syncs): a backoff, never the service's
            # failure, which would have failed every endpoint not yet adopted when Redis went (issue #50)
            raise ProvisionerBackoff(f"the fleet's ECS API budget cannot be read: {error!r}",
                                     SHARED_STATE_RETRY_S) from error

    async def _call(self, operation: str, *, budgeted: bool = True, fenced: bool = False, **arguments):
        """One ECS API call: within the fleet's budget (`budgeted`: take its slot now), off the event loop. A write
        (`fenced`) goes only if the fence, checked right here, after every wait, leaves it time to land."""
        if budgeted:
            await self._take(1)
        if fenced and self.fence is not None and await self.fence() <= 0:
            raise FenceLost(f"not written ({operation}): this gateway no longer holds the lease")
        if self.client is None:
            self.client = await asyncio.to_thread(shared_client, self.settings)
        try:
            answer = await asyncio.to_thread(getattr(self.client, operation), **arguments)
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") not in THROTTLED:
                raise
            self._backoff_s = min(BACKOFF_MAX_S, max(BACKOFF_FIRST_S, self._backoff_s * 2))
            pause = self._backoff_s * random.uniform(0.5, 1.0)
            self._not_before = time.monotonic() + pause
            log.warning("ecs_throttled", service=self.settings.service, operation=error.operation_name,
                        backoff_s=round(pause, 2), base_s=self._backoff_s)
            raise ProvisionerBackoff(f"ECS throttled {error.operation_name}", pause) from error
        self._backoff_s = 0.0
        return answer

    async def _task_arns(self) -> list[str]:
        arns: list[str] = []
        token = None
        while True:
            page = await self._call("list_tasks", cluster=self.settings.cluster,
                                    serviceName=self.settings.service, desiredStatus="RUNNING",
                                    **({"nextToken": token} if token else {}))
            arns.extend(page.get("taskArns", []))
            token = page.get("nextToken")
            if not token:
                return arns

    async def _describe(self, arns: list[str]) -> list[dict]:
        tasks = []
        for start in range(0, len(arns), DESCRIBE_LIMIT):
            answer = await self._call("describe_tasks", cluster=self.settings.cluster,
                                      tasks=arns[start:start + DESCRIBE_LIMIT])
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
