"""Endpoints over real worker processes (`python -m worker`, the tiny random model): scale from zero,
idle back to zero, failures, drain, failover after a SIGKILL, autoscaling under load, and a shutdown
that cuts no stream. The gateway's `Endpoints` service runs in the test's event loop."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import msgspec
import pytest

from common.protocol import Accepted, Done, Token
from gateway.endpoints import metrics
from gateway.endpoints.activator import Lease
from gateway.endpoints.errors import EndpointUnavailable
from gateway.endpoints.spec import parse_endpoint
from gateway.errors import WorkerLost
from gateway.serving.worker_client import WorkerClient
from testkit.sluice import pid_alive
from testkit.tiny_model import write_tiny_model
from tests.gateway.endpoints.helpers import FAST, START_S, complete, generate, open_endpoints, until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


def endpoint_spec(tiny: Path, name: str = "tiny/llama", **fields):
    return parse_endpoint({"name": name, "source": str(tiny), "threads": 1, "decode_threads": 1,
                           "max_batch_size": 8, "max_context": 256, **fields})


def processes(endpoint):
    return endpoint.provisioner.processes


async def test_twenty_requests_at_zero_start_one_worker_and_all_succeed(tmp_path, tiny):
    endpoints = await open_endpoints(tmp_path, endpoint_spec(tiny, min_replicas=0, max_replicas=1, idle_seconds=600))
    endpoint = endpoints.resolve("tiny/llama", None)
    try:
        assert endpoint.state == "scaled_to_zero" and processes(endpoint) == []
        assert endpoints.healthy()  # asleep on purpose
        # the registry is the process's: other tests' endpoints of the same name count there too
        waits_before = metrics.REGISTRY.get_sample_value("sluice_endpoint_cold_start_seconds_count",
                                                         {"endpoint": "tiny/llama"}) or 0
        starts_before = metrics.REGISTRY.get_sample_value("sluice_endpoint_replica_starts_total",
                                                          {"endpoint": "tiny/llama"}) or 0
        results = await asyncio.gather(*(complete(endpoints, endpoint, i) for i in range(20)))
        for events, lease in results:
            assert isinstance(events[0], Accepted) and isinstance(events[-1], Done)
            assert sum(isinstance(e, Token) for e in events) == 8
            assert lease.cold_start_ms > 0
        assert len(processes(endpoint)) == 1
        starts = metrics.REGISTRY.get_sample_value("sluice_endpoint_replica_starts_total", {"endpoint": "tiny/llama"})
        assert starts - starts_before == 1
        waits = metrics.REGISTRY.get_sample_value("sluice_endpoint_cold_start_seconds_count",
                                                  {"endpoint": "tiny/llama"})
        assert waits - waits_before == 20
        assert endpoint.state == "ready" and endpoints.get("tiny/llama").replicas.ready == 1
    finally:
        await endpoints.drain_and_stop()


async def test_a_burst_at_zero_goes_to_the_one_replica_allowed_as_soon_as_it_is_ready(tmp_path, tiny):
    """No other replica is coming: the whole burst is on the worker at once (burst limit 2 x 2 = 4 here), as a
    warm endpoint takes it, rather than one request per request finished."""
    endpoints = await open_endpoints(tmp_path, endpoint_spec(tiny, min_replicas=0, max_replicas=1, idle_seconds=600,
                                                             target_concurrency=2))
    endpoint = endpoints.resolve("tiny/llama", None)
    try:
        deadline = time.monotonic() + START_S
        leases = await asyncio.gather(*(endpoint.activator.acquire(deadline) for _ in range(12)))  # none released
        assert len({lease.replica for lease in leases}) == 1 and leases[0].replica.in_flight == 12
        assert all(lease.waited_s > 0 for lease in leases)
        for lease in leases:
            lease.release()
    finally:
        await endpoints.drain_and_stop()


async def test_an_idle_endpoint_goes_back_to_zero_and_the_next_request_wakes_it(tmp_path, tiny):
    endpoints = await open_endpoints(tmp_path, endpoint_spec(tiny, min_replicas=0, max_replicas=1, idle_seconds=1))
    endpoint = endpoints.resolve("tiny/llama", None)
    try:
        events, _ = await complete(endpoints, endpoint, 0)
        pid = processes(endpoint)[0].pid
        await until(lambda: endpoint.state == "scaled_to_zero", START_S, "scale to zero")
        await until(lambda: not pid_alive(pid), START_S, "the worker's exit")
        assert processes(endpoint) == [] and endpoints.healthy()
        events, lease = await complete(endpoints, endpoint, 1)
        assert isinstance(events[-1], Done) and lease.cold_start_ms > 0
        assert processes(endpoint)[0].pid != pid
    finally:
        await endpoints.drain_and_stop()


async def test_a_source_that_does_not_load_fails_the_endpoint_and_refuses_at_once(tmp_path, tiny):
    fatal = []
    broken = endpoint_spec(tiny, name="broken/model", min_replicas=0, max_replicas=1, source=str(tmp_path / "missing"))
    endpoints = await open_endpoints(tmp_path, broken, on_fatal=fatal.append)
    endpoint = endpoints.resolve("broken/model", None)
    try:
        with pytest.raises(EndpointUnavailable) as caught:
            await endpoint.activator.acquire(time.monotonic() + START_S)  # wakes it; the worker cannot load
        assert caught.value.state == "failed" and caught.value.code == "endpoint_failed"
        assert "weights failed to load" in endpoint.failure and "missing" in endpoint.failure
        assert "retry-after" in caught.value.headers
        started = time.monotonic()
        with pytest.raises(EndpointUnavailable, match="failed"):
            await endpoint.activator.acquire(time.monotonic() + START_S)
        assert time.monotonic() - started < 10  # at once, not at the deadline: a margin no loaded machine uses up
        status = endpoints.get("broken/model")
        assert (status.state, status.replicas.starting) == ("failed", 0) and not endpoints.healthy()
        assert fatal == []  # it may sleep: not the embedded single-model setup
    finally:
        await endpoints.drain_and_stop()


async def test_the_embedded_single_model_that_cannot_load_stops_the_gateway(tmp_path):
    fatal = []
    spec = parse_endpoint({"name": "only/model", "source": str(tmp_path / "missing")})  # min_replicas 1
    endpoints = await open_endpoints(tmp_path, spec, on_fatal=fatal.append)
    try:
        await until(lambda: fatal, START_S, "the fatal report")
        assert "only/model" in fatal[0] and "cannot load" in fatal[0]
    finally:
        await endpoints.drain_and_stop()


async def test_replicas_that_keep_exiting_while_starting_are_a_crash_loop(tmp_path, tiny):
    endpoints = await open_endpoints(tmp_path, endpoint_spec(tiny, min_replicas=1, max_replicas=1),
                                     settings=msgspec.structs.replace(FAST, start_failures=2))
    endpoint = endpoints.resolve("tiny/llama", None)
    try:
        killed = set()
        while endpoint.failure is None:
            for process in processes(endpoint):
                if process.pid not in killed:
                    os.kill(process.pid, signal.SIGKILL)  # dies before it could become ready
                    killed.add(process.pid)
            await asyncio.sleep(0.02)
        assert len(killed) == 2 and endpoint.failure.startswith("crash loop")
        assert endpoint.state == "failed"
        # a PATCH is the operator's retry: the failure clears and a replica starts
        await endpoints.patch("tiny/llama", {"idle_seconds": 100})
        await until(lambda: endpoint.state == "ready", START_S, "the retry")
    finally:
        await endpoints.drain_and_stop()


async def two_ready_replicas(tmp_path: Path, tiny: Path, **fields):
    endpoints = await open_endpoints(tmp_path, endpoint_spec(tiny, min_replicas=2, max_replicas=2, **fields))
    try:
        await until(lambda: endpoints.get("tiny/llama").replicas.ready == 2, START_S, "two ready replicas")
    except BaseException:
        await endpoints.drain_and_stop()
        raise
    return endpoints, endpoints.resolve("tiny/llama", None)


async def test_a_scale_down_during_running_streams_cuts_none(tmp_path, tiny):
    endpoints, endpoint = await two_ready_replicas(tmp_path, tiny, drain_seconds=60)
    try:
        streams = [asyncio.create_task(complete(endpoints, endpoint, i, tokens=24, pause=0.1)) for i in range(8)]
        await until(lambda: sum(r.in_flight for r in endpoint.pool.replicas) == 8, START_S, "eight streams")
        before = {p.pid for p in processes(endpoint)}
        await endpoints.patch("tiny/llama", {"min_replicas": 1, "max_replicas": 1})
        await until(lambda: endpoints.get("tiny/llama").replicas.draining == 1, START_S, "a draining replica")
        results = await asyncio.gather(*streams)
        for events, _ in results:  # every stream ran to its end
            assert isinstance(events[-1], Done) and sum(isinstance(e, Token) for e in events) == 24
        await until(lambda: len(processes(endpoint)) == 1, START_S, "the drained replica's stop")
        stopped = before - {p.pid for p in processes(endpoint)}
        await until(lambda: not any(pid_alive(pid) for pid in stopped), START_S, "its process exit")
    finally:
        await endpoints.drain_and_stop()


async def test_sigkill_of_a_replica_moves_waiting_requests_and_cuts_the_streaming_one_cleanly(tmp_path, tiny):
    endpoints, endpoint = await two_ready_replicas(tmp_path, tiny, max_batch_size=1)
    try:
        doomed = endpoint.pool.replicas[0]
        survivor = endpoint.pool.replicas[1]
        pid = next(p.pid for p in processes(endpoint) if p.url == doomed.url)
        deadline = time.monotonic() + START_S
        frozen = asyncio.Event()

        async def on_doomed(index: int, tokens: int, freeze: bool = False):
            doomed.in_flight += 1  # the test places the request: a lease on the doomed replica
            relayed = []
            lease = Lease(doomed, 0.0, endpoint.activator)
            try:
                async for event in WorkerClient(endpoints).stream(endpoint, lease, generate(index, tokens), deadline):
                    relayed.append(event)
                    if freeze and isinstance(event, Token):
                        # the worker stops mid-stream, however fast this machine would have finished it
                        os.kill(pid, signal.SIGSTOP)
                        frozen.set()
                        freeze = False
            except WorkerLost as lost:
                return relayed, lost
            return relayed, None

        streaming = asyncio.create_task(on_doomed(0, tokens=200, freeze=True))
        await asyncio.wait_for(frozen.wait(), START_S)
        waiting = [asyncio.create_task(on_doomed(i, tokens=6)) for i in range(1, 5)]
        await until(lambda: doomed.in_flight == 5, START_S, "four more requests on the frozen replica")
        await asyncio.sleep(0.5)  # their bodies reach the frozen worker's socket; none can get a first token
        os.kill(pid, signal.SIGKILL)
        relayed, lost = await streaming
        assert lost is not None and lost.code == "worker_lost"
        tokens_sent = sum(isinstance(e, Token) for e in relayed)
        assert 0 < tokens_sent < 200 and not any(isinstance(e, Done) for e in relayed)
        for task in waiting:  # none had its first token: each moved to the survivor, invisibly
            events, error = await task
            assert error is None and isinstance(events[-1], Done) and events[-1].worker_id
            assert [type(e) for e in events].count(Accepted) == 1
            assert sum(isinstance(e, Token) for e in events) == 6
        assert survivor.in_flight == 0
    finally:
        await endpoints.drain_and_stop()


async def test_sustained_load_scales_up_and_back_down(tmp_path, tiny):
    endpoints = await open_endpoints(tmp_path, endpoint_spec(tiny, min_replicas=1, max_replicas=2,
                                                             target_concurrency=2, drain_seconds=30))
    endpoint = endpoints.resolve("tiny/llama", None)
    try:
        await until(lambda: endpoint.state == "ready", START_S, "the first replica")
        stop = asyncio.Event()

        async def client(index: int):
            while not stop.is_set():
                await complete(endpoints, endpoint, index, tokens=16, pause=0.05)

        clients = [asyncio.create_task(client(i)) for i in range(6)]
        await until(lambda: endpoints.get("tiny/llama").replicas.ready == 2, START_S, "a second replica")
        stop.set()
        await asyncio.gather(*clients)
        await until(lambda: endpoints.get("tiny/llama").replicas.ready == 1 and len(processes(endpoint)) == 1,
                    60, "the scale back down")
    finally:
        await endpoints.drain_and_stop()


async def test_drain_and_stop_lets_every_stream_finish(tmp_path, tiny):
    endpoints = await open_endpoints(tmp_path, endpoint_spec(tiny, min_replicas=1, max_replicas=1))
    endpoint = endpoints.resolve("tiny/llama", None)
    await until(lambda: endpoint.state == "ready", START_S, "the replica")
    streams = [asyncio.create_task(complete(endpoints, endpoint, i, tokens=20, pause=0.05)) for i in range(4)]
    await until(lambda: sum(r.in_flight for r in endpoint.pool.replicas) == 4, START_S, "four streams")
    pids = [p.pid for p in processes(endpoint)]
    await endpoints.drain_and_stop()  # what SIGTERM runs
    for events, _ in await asyncio.gather(*streams):
        assert isinstance(events[-1], Done) and sum(isinstance(e, Token) for e in events) == 20
    assert not any(pid_alive(pid) for pid in pids)
    with pytest.raises(EndpointUnavailable) as caught:
        await endpoint.activator.acquire(time.monotonic() + 1)
    assert caught.value.state == "draining"

