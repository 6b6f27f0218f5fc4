"""The `Endpoints` service as the admin API and the request flow will call it, over both databases,
with static endpoints on stub workers (tests/gateway/endpoints/test_local_endpoints.py runs real ones)."""

from __future__ import annotations

import asyncio
import time

import msgspec
import pytest

from auth.service import Principal
from common.protocol import Done
from gateway.endpoints.errors import EndpointConflict, EndpointNotFound, InvalidEndpoint
from gateway.endpoints.service import Endpoints
from gateway.endpoints.spec import parse_endpoint
from gateway.serving.model_aliases import endpoint_named
from gateway.serving.worker_client import WorkerClient
from testkit.servers import free_port
from tests.gateway.endpoints.helpers import FAST, START_S, generate, until

TEAM_A = Principal(key_id="key-a", team_id="team-a", user_id=None, is_admin=False)
TEAM_B = Principal(key_id="key-b", team_id="team-b", user_id=None, is_admin=False)
ADMIN = Principal(key_id="key-admin", team_id="ops", user_id=None, is_admin=True)

def static(*urls: str) -> dict:
    """A static provisioner over `urls`, as an endpoint body gives it."""
    return {"kind": "static", "urls": list(urls)}



@pytest.fixture
def workers(named_workers):
    return named_workers[:2]


async def opened(database_url: str, tmp_path, declared=()) -> Endpoints:
    endpoints = await Endpoints.open(database_url, declared, tmp_path, FAST)
    await endpoints.start()
    return endpoints


async def test_create_patch_delete_and_a_restart_keeps_them(store_url, tmp_path, workers):
    endpoints = await opened(store_url, tmp_path)
    try:
        created = await endpoints.create({"name": "org/model-a", "provisioner": static(workers[0].url),
                                          "max_wait_seconds": 5})
        assert created.name == "org/model-a" and created.spec.max_wait_seconds == 5
        await endpoints.create({"name": "org/model-b", "provisioner": static(workers[1].url)})
        await until(lambda: endpoints.get("org/model-a").state == "ready", START_S, "the stub's readiness")
        patched = await endpoints.patch("org/model-a", {"max_wait_seconds": 9, "team_id": "team-a"})
        assert patched.spec.max_wait_seconds == 9 and patched.spec.team_id == "team-a"
        await endpoints.delete("org/model-b")
        assert [s.name for s in endpoints.list()] == ["org/model-a"]
        with pytest.raises(EndpointNotFound):
            endpoints.get("org/model-b")
    finally:
        await endpoints.drain_and_stop()

    again = await opened(store_url, tmp_path)
    try:
        (status,) = again.list()
        assert (status.name, status.spec.max_wait_seconds, status.spec.team_id) == ("org/model-a", 9, "team-a")
        assert status.spec.provisioner.urls == [workers[0].url]
    finally:
        await again.drain_and_stop()


async def test_admin_refusals_name_the_problem(store_url, tmp_path, workers):
    declared = parse_endpoint({"name": "org/declared", "provisioner": static(workers[0].url)})
    endpoints = await opened(store_url, tmp_path, [declared])
    try:
        with pytest.raises(InvalidEndpoint, match=r"`min_replicas` \(3\) must not exceed"):
            await endpoints.create({"name": "org/x", "min_replicas": 3, "max_replicas": 1})
        with pytest.raises(InvalidEndpoint, match=r"\$.provisioner"):
            await endpoints.create({"name": "org/x", "provisioner": {"kind": "kubernetes"}})
        with pytest.raises(InvalidEndpoint, match="`name`"):
            await endpoints.create({"name": "bad name"})
        with pytest.raises(InvalidEndpoint, match=r"`urls` is no longer a setting: give a static provisioner"):
            await endpoints.create({"name": "org/x", "urls": [workers[1].url]})
        with pytest.raises(EndpointConflict, match="exists already"):
            await endpoints.create({"name": "org/declared", "provisioner": static(workers[1].url)})
        with pytest.raises(EndpointConflict, match="declared in the config file"):
            await endpoints.delete("org/declared")
        with pytest.raises(InvalidEndpoint, match="`source` cannot change"):
            await endpoints.patch("org/declared", {"source": "/x"})
        with pytest.raises(EndpointNotFound):
            await endpoints.patch("org/absent", {"idle_seconds": 1})
        with pytest.raises(EndpointNotFound):
            await endpoints.delete("org/absent")
        assert [s.name for s in endpoints.list()] == ["org/declared"]
    finally:
        await endpoints.drain_and_stop()


async def test_a_private_endpoint_is_a_404_for_other_teams(store_url, tmp_path, workers):
    endpoints = await opened(store_url, tmp_path)
    try:
        await endpoints.create({"name": "org/public", "provisioner": static(workers[0].url)})
        await endpoints.create({"name": "team-a/private", "provisioner": static(workers[1].url), "team_id": "team-a"})
        assert endpoints.resolve("team-a/private", TEAM_A).name == "team-a/private"
        assert endpoints.resolve("team-a/private", ADMIN).name == "team-a/private"
        for principal in (TEAM_B, None):
            with pytest.raises(EndpointNotFound) as caught:
                endpoints.resolve("team-a/private", principal)
            assert caught.value.status == 404 and "does not exist" in caught.value.message
        with pytest.raises(EndpointNotFound):  # one answer for absent and hidden: no probing
            endpoints.resolve("org/absent", TEAM_B)
        assert [s.name for s in endpoints.visible(TEAM_B)] == ["org/public"]
        assert sorted(s.name for s in endpoints.visible(TEAM_A)) == ["org/public", "team-a/private"]
        assert endpoint_named(endpoints, "default", TEAM_B).name == "org/public"  # the alias names a visible one
    finally:
        await endpoints.drain_and_stop()


async def test_a_request_through_the_seam_and_the_health_rule(store_url, tmp_path, workers):
    sleeping = parse_endpoint({"name": "org/sleepy", "source": str(tmp_path / "unused"), "min_replicas": 0})
    endpoints = await opened(store_url, tmp_path, [sleeping])
    try:
        assert endpoints.healthy()  # asleep on purpose
        await endpoints.create({"name": "org/unreachable", "provisioner": static(f"http://127.0.0.1:{free_port()}")})
        assert endpoints.get("org/unreachable").state == "starting" and not endpoints.healthy()
        await endpoints.delete("org/unreachable")
        await endpoints.create({"name": "org/static", "provisioner": static(workers[0].url)})
        await until(endpoints.healthy, START_S, "health")
        endpoint = endpoints.resolve("org/static", TEAM_A)
        deadline = time.monotonic() + START_S
        lease = await endpoint.activator.acquire(deadline)
        assert lease.cold_start_ms == 0
        events = [e async for e in WorkerClient(endpoints).stream(endpoint, lease, generate(1), deadline)]
        assert isinstance(events[-1], Done) and events[-1].worker_id == workers[0].worker_id
        assert endpoint.pool.replicas[0].in_flight == 0
        states = {s.name: s.state for s in endpoints.states()}
        assert states == {"org/sleepy": "scaled_to_zero", "org/static": "ready"}
        encoded = msgspec.json.decode(msgspec.json.encode(endpoints.get("org/static")))
        assert encoded["state"] == "ready" and encoded["replicas"] == {"ready": 1, "starting": 0, "draining": 0}
    finally:
        await endpoints.drain_and_stop()


async def test_a_stop_that_comes_with_a_wake_up_call_still_ends_the_endpoints_loop(tmp_path):
    """`drain_and_stop` cancels the endpoint's loop, which may be woken in the same instant (a request starting
    to wait, an owner's drain done): the loop must end all the same. With `asyncio.wait_for` (Python 3.11) the
    wake-up won, the cancel was lost, the loop ran on and `drain_and_stop` waited for it forever: a stopping
    gateway that began draining and never exited."""
    endpoints = await Endpoints.open(f"sqlite:///{tmp_path}/sluice.db",
                                     [parse_endpoint({"name": "org/quiet", "min_replicas": 0})], tmp_path, FAST)
    await endpoints.start()
    controller = endpoints.controllers["org/quiet"]
    await asyncio.sleep(3 * FAST.tick_seconds)  # the loop waits between its ticks (which have nothing to await)
    controller.poke()
    await asyncio.wait_for(endpoints.drain_and_stop(), 30)  # a lost cancel: TimeoutError
