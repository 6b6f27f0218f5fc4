"""The activator's queue discipline, on a real pool of replicas whose readiness the test sets (the
controller sets it from `/load` in production; tests/gateway/endpoints/test_local_endpoints.py runs
the whole loop with real workers)."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.endpoints import metrics
from gateway.endpoints.activator import Activator, Availability, Lease, StillWaiting
from gateway.endpoints.errors import EndpointUnavailable
from gateway.replicas.pool import ModelPool, Replica


class Endpoint:
    """A pool, an activator over it, and the state the activator asks about."""

    def __init__(self, name: str, *, max_waiting: int = 100, target: float = 2, burst: float = 1.5):
        self.name = name
        self.pool = ModelPool(name)
        self.state = "scaled_to_zero"
        self.reason: str | None = None
        self.demands = 0
        self.activator = Activator(name, self.pool, self.availability, self.on_demand, max_waiting=max_waiting,
                                   release_limit=1)
        self.activator.configure(max_waiting=max_waiting, target_concurrency=target, burst_factor=burst)

    def availability(self) -> Availability:
        return Availability(self.state, self.reason, 7.0)

    def on_demand(self) -> None:
        self.demands += 1

    def replica(self, ready: bool = True) -> Replica:
        replica = Replica(f"http://replica-{len(self.pool.replicas)}")
        replica.healthy = replica.ever_ready = ready
        self.pool.replicas.append(replica)
        return replica

    def ready(self, replica: Replica) -> None:
        replica.healthy = replica.ever_ready = True
        self.state = "ready"
        self.activator.pump()


def soon(seconds: float = 5.0) -> float:
    return time.monotonic() + seconds


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_free_replica_is_taken_at_once_without_queueing():
    endpoint = Endpoint("direct")
    replica = endpoint.replica()
    lease = await endpoint.activator.acquire(soon())
    assert lease.replica is replica and lease.waited_s == 0 and replica.in_flight == 1
    assert endpoint.demands == 0
    endpoint.activator.release(lease)
    endpoint.activator.release(lease)  # twice is once
    assert replica.in_flight == 0


async def test_waiters_are_released_oldest_first_and_never_more_than_the_burst_per_replica():
    endpoint = Endpoint("burst", target=2, burst=1.5)  # release limit ceil(3.0) = 3
    tasks = [asyncio.create_task(endpoint.activator.acquire(soon())) for _ in range(8)]
    await settle()
    assert endpoint.activator.waiting == 8 and endpoint.demands == 8
    replica = endpoint.replica(ready=False)
    endpoint.ready(replica)
    await settle()
    done = [t for t in tasks if t.done()]
    assert done == tasks[:3]  # the three oldest, no more
    assert replica.in_flight == 3 and endpoint.activator.waiting == 5
    endpoint.activator.release(tasks[0].result())
    await settle()
    assert [t.done() for t in tasks] == [True] * 4 + [False] * 4
    second = endpoint.replica(ready=False)
    endpoint.ready(second)
    await settle()
    assert [t.done() for t in tasks] == [True] * 7 + [False]
    assert second.in_flight == 3
    assert all(t.result().waited_s > 0 for t in tasks[:7])


async def test_once_no_replica_is_starting_the_queue_goes_to_the_replicas_up_to_their_capacity_at_once():
    """What a warm replica would take (its rows and its worker's queue) is not held back in the gateway."""
    endpoint = Endpoint("capacity", target=2, burst=1.5)  # burst limit 3
    endpoint.activator.configure(max_waiting=100, target_concurrency=2, burst_factor=1.5, capacity=6)
    tasks = [asyncio.create_task(endpoint.activator.acquire(soon())) for _ in range(9)]
    await settle()
    replica = endpoint.replica(ready=False)
    endpoint.ready(replica)  # another replica may still be starting: the burst limit
    await settle()
    assert sum(t.done() for t in tasks) == 3
    endpoint.activator.replicas_starting(False)  # none is: up to the capacity, oldest first
    await settle()
    assert [t.done() for t in tasks] == [True] * 6 + [False] * 3
    assert replica.in_flight == 6 and endpoint.activator.waiting == 3
    endpoint.activator.release(tasks[0].result())
    await settle()
    assert [t.done() for t in tasks] == [True] * 7 + [False] * 2
    for task in tasks[7:]:
        task.cancel()


def test_the_capacity_is_never_below_the_burst_limit():
    endpoint = Endpoint("small", target=4, burst=2)
    endpoint.activator.configure(max_waiting=10, target_concurrency=4, burst_factor=2, capacity=3)
    assert endpoint.activator.capacity == endpoint.activator.release_limit == 8


async def test_new_arrivals_queue_behind_waiters_even_when_a_replica_has_room():
    endpoint = Endpoint("fifo", target=1, burst=1)
    first, waiting = (asyncio.create_task(endpoint.activator.acquire(soon())) for _ in range(2))
    await settle()
    replica = endpoint.replica(ready=False)
    endpoint.ready(replica)
    await settle()
    assert first.done() and not waiting.done()
    later = asyncio.create_task(endpoint.activator.acquire(soon()))  # a replica is up, but someone waits
    await settle()
    assert endpoint.activator.waiting == 2
    endpoint.activator.release(first.result())
    await settle()
    assert waiting.done() and not later.done()
    assert waiting.result().replica is replica
    later.cancel()


def test_with_nobody_waiting_a_busy_replica_still_takes_requests_directly():
    """The burst limit paces a queue's release; the replica's capacity (its worker's rows and queue) bounds
    steady load: past it a request waits here (tests/gateway/test_one_road.py), as the worker would refuse it."""
    endpoint = Endpoint("steady", target=1, burst=1)
    endpoint.activator.configure(max_waiting=100, target_concurrency=1, burst_factor=1, capacity=16)
    replica = endpoint.replica()
    replica.in_flight = 10
    assert asyncio.run(endpoint.activator.acquire(soon())).replica is replica


async def test_a_full_queue_refuses_with_the_state_and_retry_after_and_still_wakes_the_endpoint():
    endpoint = Endpoint("full", max_waiting=2)
    tasks = [asyncio.create_task(endpoint.activator.acquire(soon())) for _ in range(2)]
    await settle()
    with pytest.raises(EndpointUnavailable) as caught:
        await endpoint.activator.acquire(soon())
    error = caught.value
    assert (error.code, error.state, error.status) == ("queue_full", "scaled_to_zero", 503)
    assert error.headers["retry-after"] == "7" and error.retry_after == 7
    assert endpoint.activator.turned_away == 1 and endpoint.demands == 3
    for task in tasks:
        task.cancel()


async def test_no_queue_at_all_refuses_at_once_but_counts_as_demand():
    endpoint = Endpoint("no-queue", max_waiting=0)
    with pytest.raises(EndpointUnavailable, match="already waiting"):
        await endpoint.activator.acquire(soon())
    assert endpoint.activator.turned_away == 1


async def test_the_wait_ends_at_the_deadline():
    endpoint = Endpoint("slow")
    endpoint.state = "starting"
    started = time.monotonic()
    with pytest.raises(EndpointUnavailable) as caught:
        await endpoint.activator.acquire(soon(0.2))
    assert time.monotonic() - started >= 0.2
    assert (caught.value.code, caught.value.state) == ("scale_up_timeout", "starting")
    assert endpoint.activator.waiting == 0
    with pytest.raises(EndpointUnavailable, match="in time"):  # a deadline already past
        await endpoint.activator.acquire(time.monotonic() - 1)


async def test_a_timer_that_fires_before_the_deadline_is_no_keepalive():
    """uvloop's timers fire up to a millisecond early; a wait with no keep-alives (a plain answer) must then
    still end in the refusal, never in a StillWaiting, which would turn the answer into a stream."""
    endpoint = Endpoint("early-timer")
    endpoint.state = "starting"
    origin = time.monotonic()
    slow = Activator("early-timer", endpoint.pool, endpoint.availability, endpoint.on_demand, max_waiting=10,
                     release_limit=1, clock=lambda: origin + (time.monotonic() - origin) * 0.5)
    steps = []
    with pytest.raises(EndpointUnavailable) as caught:
        async for step in slow.wait(slow.clock() + 0.1, keepalive_s=float("inf")):
            steps.append(step)
    assert steps == [] and caught.value.code == "scale_up_timeout" and slow.waiting == 0


async def test_a_failed_endpoint_answers_at_once_and_ends_every_wait():
    endpoint = Endpoint("failing")
    tasks = [asyncio.create_task(endpoint.activator.acquire(soon(60))) for _ in range(3)]
    await settle()
    endpoint.state, endpoint.reason = "failed", "weights failed to load: no such file"
    endpoint.activator.reject_all("endpoint_failed", "the endpoint failed")
    for task in tasks:
        with pytest.raises(EndpointUnavailable) as caught:
            await task
        assert caught.value.state == "failed" and "no such file" in caught.value.message
    started = time.monotonic()
    with pytest.raises(EndpointUnavailable) as caught:
        await endpoint.activator.acquire(soon(60))
    # at once, not at its deadline a minute away (a margin no loaded machine uses up)
    assert time.monotonic() - started < 10 and caught.value.code == "endpoint_failed"
    assert caught.value.reason == "weights failed to load: no such file"


async def test_take_free_leases_at_once_or_says_the_request_would_wait():
    endpoint = Endpoint("no-wait")
    assert endpoint.activator.take_free() is None and endpoint.activator.waiting == 0  # nothing ready: no lease,
    assert endpoint.demands == 0  # and no place taken in the queue, no demand counted
    replica = endpoint.replica()
    lease = endpoint.activator.take_free()
    assert lease.replica is replica and lease.waited_s == 0 and replica.in_flight == 1
    queued = asyncio.create_task(endpoint.activator.acquire(soon()))
    replica.healthy = False
    await settle()
    replica.healthy = True
    assert endpoint.activator.waiting == 1
    assert endpoint.activator.take_free() is None  # someone waits before it: it would queue behind them
    endpoint.activator.pump()
    endpoint.activator.release(await queued)
    endpoint.activator.release(lease)
    assert replica.in_flight == 0


async def test_an_endpoint_shutting_down_takes_nothing_even_onto_a_free_replica():
    endpoint = Endpoint("stopping")
    replica = endpoint.replica()
    endpoint.state = "draining"  # SIGTERM's first step: the replica is still there, busy with its streams
    with pytest.raises(EndpointUnavailable) as caught:
        await endpoint.activator.acquire(soon())
    assert (caught.value.code, caught.value.state) == ("endpoint_draining", "draining")
    assert replica.in_flight == 0 and "retry-after" in caught.value.headers


async def test_a_cancelled_waiter_leaves_the_queue():
    endpoint = Endpoint("cancel")
    tasks = [asyncio.create_task(endpoint.activator.acquire(soon())) for _ in range(3)]
    await settle()
    tasks[1].cancel()
    await settle()
    assert tasks[1].cancelled() and endpoint.activator.waiting == 2
    replica = endpoint.replica(ready=False)
    endpoint.ready(replica)
    await settle()
    assert tasks[0].done() and tasks[2].done() and replica.in_flight == 2


async def test_a_waiter_cancelled_as_it_is_handed_a_replica_gives_the_replica_back():
    endpoint = Endpoint("race")
    task = asyncio.create_task(endpoint.activator.acquire(soon()))
    await settle()
    replica = endpoint.replica(ready=False)
    endpoint.ready(replica)  # sets the waiter's result ...
    task.cancel()  # ... and the client leaves before the waiter runs again
    with pytest.raises(asyncio.CancelledError):
        await task
    assert replica.in_flight == 0 and endpoint.activator.waiting == 0


async def test_keepalives_while_waiting_then_the_lease():
    endpoint = Endpoint("keepalive")
    steps = []

    async def consume():
        waiting = endpoint.activator.wait(soon(), keepalive_s=0.05)
        async for step in waiting:
            steps.append(step)
            if isinstance(step, Lease):
                return step

    task = asyncio.create_task(consume())
    started = time.monotonic()
    # two keepalives and 150 ms of waiting, however few of its 50 ms ticks a loaded machine gave the wait
    while sum(isinstance(s, StillWaiting) for s in steps) < 2 or time.monotonic() - started < 0.18:
        await asyncio.sleep(0.01)
    endpoint.ready(endpoint.replica(ready=False))
    lease = await task
    keepalives = [s for s in steps if isinstance(s, StillWaiting)]
    assert len(keepalives) >= 2 and steps[-1] is lease
    assert keepalives == sorted(keepalives, key=lambda s: s.waited_s)
    assert lease.cold_start_ms >= 150


async def test_closing_the_wait_early_takes_the_request_out():
    endpoint = Endpoint("closed")
    waiting = endpoint.activator.wait(soon(), keepalive_s=0.01)
    assert isinstance(await anext(waiting), StillWaiting)
    assert endpoint.activator.waiting == 1
    await waiting.aclose()
    assert endpoint.activator.waiting == 0


async def test_the_wait_is_observed_in_the_cold_start_histogram():
    endpoint = Endpoint("histogram")
    before = metrics.REGISTRY.get_sample_value("sluice_endpoint_cold_start_seconds_count", {"endpoint": "histogram"})
    task = asyncio.create_task(endpoint.activator.acquire(soon()))
    await settle()
    endpoint.ready(endpoint.replica(ready=False))
    await task
    after = metrics.REGISTRY.get_sample_value("sluice_endpoint_cold_start_seconds_count", {"endpoint": "histogram"})
    assert (after or 0) - (before or 0) == 1


async def test_draining_and_ejected_replicas_take_nothing():
    endpoint = Endpoint("skip")
    draining, ejected, good = endpoint.replica(), endpoint.replica(), endpoint.replica()
    draining.draining = True
    ejected.eject(time.monotonic(), 30)
    good.in_flight = 2  # busier (under its capacity), but the only one taking requests
    lease = await endpoint.activator.acquire(soon())
    assert lease.replica is good


async def test_queued_requests_are_released_in_tenants_turns():
    """One tenant's many prompts (a lease each, taken one after another) do not hold another tenant's first
    request behind them: the waiter whose tenant holds the fewest leases goes first."""
    endpoint = Endpoint("turns", target=1, burst=1)
    replica = endpoint.replica(ready=False)
    big = [asyncio.create_task(endpoint.activator.acquire(soon(), tenant="big")) for _ in range(3)]
    await settle()
    small = asyncio.create_task(endpoint.activator.acquire(soon(), tenant="small"))
    await settle()
    endpoint.ready(replica)  # room for one at a time
    await settle()
    assert big[0].done() and not small.done()
    endpoint.activator.release(big[0].result())
    await settle()
    assert small.done() and not big[1].done()  # neither holds a lease now: "small" was served less recently
    assert small.result().tenant == "small"
    endpoint.activator.release(small.result())
    await settle()
    assert big[1].done() and not big[2].done()
    endpoint.activator.release(big[1].result())
    await settle()
    assert big[2].done()
    endpoint.activator.release(big[2].result())
    assert replica.in_flight == 0
