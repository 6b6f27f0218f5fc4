"""One road to a worker (issue #46, item 3): one client per replica and one lease API.

The review found two HTTP clients per replica (an httpx client for the polls beside the transport of the worker
calls) and two lease APIs (`Endpoints.acquire/take_free/wait/release` beside `WorkerClient.lease/take_free`, both
over the activator). The source scan fails when a second client or lease path appears again; the rest proves the
lease API's promises on a real pool: a lease comes back however its holder ends, and a busy replica takes no
more than its room.
"""

from __future__ import annotations

import ast
import asyncio
import time
from pathlib import Path

import pytest

from gateway.endpoints.activator import Activator, Availability
from gateway.replicas.pool import ModelPool, Replica, ReplicaRouter
from testkit.protocol_worker import protocol_worker

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"
# HTTP clients of the gateway that never reach a worker: the OIDC provider, the alerts' webhooks
OTHER_CLIENTS = {"dashboard/oidc.py", "serving/budget_alerts.py"}


def _sources() -> list[tuple[str, ast.Module]]:
    return [(str(path.relative_to(GATEWAY)), ast.parse(path.read_text(), str(path)))
            for path in sorted(GATEWAY.rglob("*.py"))]


def _calls(tree: ast.Module) -> list[str]:
    """The dotted names of every call in `tree` (`httpx.AsyncClient`, `Lease`, `self.activator.release`)."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            parts, func = [], node.func
            while isinstance(func, ast.Attribute):
                parts.append(func.attr)
                func = func.value
            if isinstance(func, ast.Name):
                parts.append(func.id)
            names.append(".".join(reversed(parts)))
    return names


def test_one_client_per_replica():
    clients, transports, sockets = set(), set(), set()
    for module, tree in _sources():
        for name in _calls(tree):
            last = name.rsplit(".", 1)[-1]
            if last in {"AsyncClient", "Client", "ClientSession", "HTTPConnection", "AsyncHTTPTransport"}:
                clients.add(module)
            if last == "WorkerHTTP":
                transports.add(module)
            if last in {"create_connection", "open_connection"}:
                sockets.add(module)
    assert clients <= OTHER_CLIENTS, f"an HTTP client outside the worker transport: {clients - OTHER_CLIENTS}"
    assert transports == {"replicas/pool.py"}, "a replica's one WorkerHTTP is made by its router alone"
    assert sockets == {"replicas/transport.py"}


def test_one_lease_api():
    made, counted, wrappers = set(), set(), set()
    for module, tree in _sources():
        if "Lease" in _calls(tree):
            made.add(module)
        for node in ast.walk(tree):
            if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Attribute) \
                    and node.target.attr == "in_flight":
                counted.add(module)
            if isinstance(node, ast.ClassDef) and module.split("/")[0] in {"endpoints", "serving", "replicas"}:
                wrappers |= {f"{module}:{node.name}.{method.name}" for method in node.body
                             if isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef)
                             and method.name in {"acquire", "take_free", "lease", "leased", "release"}}
    wrappers -= {"endpoints/activator.py:Activator.acquire", "endpoints/activator.py:Activator.take_free",
                 "endpoints/activator.py:Activator.leased", "endpoints/activator.py:Activator.release",
                 "endpoints/activator.py:Lease.release", "replicas/failover.py:Leased.release"}
    assert made == {"endpoints/activator.py"}, "a lease is made by the activator alone"
    assert counted == {"endpoints/activator.py"}, "a replica's in_flight counts the activator's leases alone"
    assert not wrappers, f"a second lease API: {wrappers}"


def _pool(*capacities: int) -> tuple[Activator, list[Replica]]:
    pool = ModelPool("m")
    activator = Activator("m", pool, lambda: Availability("ready", None, 1.0), lambda: None, max_waiting=10,
                          release_limit=1)
    replicas = [Replica(f"http://replica-{index}") for index in range(len(capacities))]
    for replica in replicas:
        replica.healthy = replica.ever_ready = True
        pool.replicas.append(replica)
    activator.configure(max_waiting=10, target_concurrency=1, burst_factor=1, capacity=max(capacities))
    activator.replicas_starting(False)
    return activator, replicas


async def test_a_lease_is_released_when_its_block_fails():
    activator, [replica] = _pool(2)
    with pytest.raises(RuntimeError):
        async with activator.leased(time.monotonic() + 5) as lease:
            assert replica.in_flight == 1 and lease.replica is replica
            raise RuntimeError("the call failed")
    assert replica.in_flight == 0 and lease.released
    lease.release()  # again: counted once
    assert replica.in_flight == 0


async def test_a_lease_is_released_when_its_holder_is_cancelled():
    activator, [replica] = _pool(2)
    holding = asyncio.Event()

    async def hold() -> None:
        async with activator.leased(time.monotonic() + 5):
            holding.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(hold())
    await holding.wait()
    assert replica.in_flight == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert replica.in_flight == 0


async def test_a_busy_replica_is_not_over_leased():
    activator, [replica] = _pool(2)
    deadline = time.monotonic() + 30
    first, second = activator.take_free(), await activator.acquire(deadline)
    assert first is not None and replica.in_flight == 2
    assert activator.take_free() is None  # full: nothing at once
    queued = asyncio.create_task(activator.acquire(deadline))
    await asyncio.sleep(0)
    assert activator.waiting == 1 and replica.in_flight == 2  # it waits; the replica holds its two
    with pytest.raises(Exception, match="no ready worker"):
        await activator.acquire(None)  # a caller that must not wait is refused, not squeezed in
    first.release()
    third = await queued
    assert third.replica is replica and replica.in_flight == 2
    second.release()
    third.release()
    assert replica.in_flight == 0


async def test_a_waiter_cancelled_in_the_queue_takes_no_lease():
    activator, [replica] = _pool(1)
    held = activator.take_free()
    waiting = asyncio.create_task(activator.acquire(time.monotonic() + 30))
    await asyncio.sleep(0)
    assert activator.waiting == 1
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert held is not None and activator.waiting == 0
    held.release()
    assert replica.in_flight == 0


async def test_the_polls_use_the_replicas_one_client():
    """`/load` and `/info` go over the replica's WorkerHTTP, with its worker secret, and leave its connection for
    the next call."""
    with protocol_worker(worker_id="w-1", model="m") as worker:
        router = ReplicaRouter()
        replica = router.add_replica("m", worker.url)
        try:
            await replica.poll()
            assert replica.healthy and replica.info is not None and replica.load.worker_id == "w-1"
            assert len(replica.worker._idle) == 1  # kept alive: the next call reuses it
        finally:
            await router.close()
        assert not replica.worker._idle
