"""Failover over real HTTP: stub workers that refuse, fail with a 5xx, or die mid-stream. Before the
first event the request moves to another replica (at most twice) and the failed one sits out; after
it, the caller gets the events relayed so far and then `WorkerLost`."""

from __future__ import annotations

import asyncio
import time

import pytest

from common.protocol import Accepted, Done, Error, GenerateRequest, Token
from gateway.endpoints.activator import Activator, Availability, Lease
from gateway.errors import Overloaded, Unavailable, WorkerLost
from gateway.replicas.failover import failover, stream_with_failover
from gateway.replicas.pool import ReplicaRouter
from gateway.replicas.relay import exchange
from testkit.protocol_worker import ProtocolWorker, Reply
from tests.gateway.endpoints.helpers import START_S, answer

REQUEST = GenerateRequest(request_id="r1", model="stub", prompt="hi")
TOKENS = 5  # in each worker's answer
FAILURES = {"refuse": Reply.dropped(), "unavailable": Reply.refused(503, "unavailable", "stub is down"),
            "bare_502": Reply.bare(502, b"bad"), "overloaded": Reply.refused(429, "overloaded", "stub is full"),
            "internal_event": Reply([Error(kind="internal", message="stub broke")])}


def fail(worker: ProtocolWorker, how: str) -> None:
    worker.replies = [FAILURES[how]]


class Stubs:
    def __init__(self, router: ReplicaRouter, workers: list[ProtocolWorker]):
        self.router = router
        self.workers = workers
        self.pool = router.pool("stub")
        self.activator = Activator("stub", self.pool, lambda: Availability("ready", None, 1.0), lambda: None,
                                   max_waiting=10, release_limit=8)

    def replica(self, worker: ProtocolWorker):
        return next(r for r in self.pool.replicas if r.url == worker.url)

    def stream(self, lease, ejection_s: float = 30.0):
        deadline = time.monotonic() + START_S
        return stream_with_failover(REQUEST, lease, reacquire=lambda tried: self.activator.acquire(deadline, tried),
                                    ejection_s=ejection_s)

    async def lease_on(self, worker: ProtocolWorker):
        """A lease on this worker's replica, as if the activator had picked it."""
        replica = self.replica(worker)
        replica.in_flight += 1
        return Lease(replica, 0.0, self.activator)


@pytest.fixture
async def stubs(named_workers):
    router = ReplicaRouter()
    for worker in named_workers:
        router.add_replica("stub", worker.url, worker.worker_id)
    await asyncio.gather(*(replica.poll() for replica in router.pool("stub").replicas))
    yield Stubs(router, named_workers)
    await router.close()


async def collect(events) -> list:
    return [event async for event in events]


@pytest.mark.parametrize("mode", ["refuse", "unavailable", "bare_502", "internal_event"])
async def test_a_failure_before_the_first_event_moves_the_request_and_ejects_the_replica(stubs, mode):
    bad, good = stubs.workers[0], stubs.workers[1]
    fail(bad, mode)
    for worker in stubs.workers[2:]:
        stubs.replica(worker).draining = True  # only `good` is left to retry on
    events = await collect(stubs.stream(await stubs.lease_on(bad)))
    assert [type(e) for e in events].count(Accepted) == 1  # the retry is invisible
    assert sum(isinstance(e, Token) for e in events) == TOKENS and isinstance(events[-1], Done)
    assert events[-1].worker_id == good.worker_id
    assert bad.generate_calls == 1 and good.generate_calls == 1
    bad_replica = stubs.replica(bad)
    assert bad_replica.ejected_until > time.monotonic() + 25 and not bad_replica.available(time.monotonic())
    assert all(r.in_flight == 0 for r in stubs.pool.replicas)


async def test_an_overloaded_replica_is_retried_elsewhere_but_not_ejected(stubs):
    busy = stubs.workers[0]
    fail(busy, "overloaded")
    events = await collect(stubs.stream(await stubs.lease_on(busy)))
    assert isinstance(events[-1], Done)
    assert stubs.replica(busy).ejected_until == 0


async def test_at_most_two_retries_then_the_last_error(stubs):
    for worker in stubs.workers:
        fail(worker, "unavailable")
    with pytest.raises(Unavailable, match="stub is down"):
        await collect(stubs.stream(await stubs.lease_on(stubs.workers[0])))
    assert sum(w.generate_calls for w in stubs.workers) == 3
    assert all(r.in_flight == 0 for r in stubs.pool.replicas)


async def test_a_worker_dying_mid_stream_is_worker_lost_after_the_tokens_sent(stubs):
    dying = stubs.workers[0]
    dying.replies = [Reply.dropped(answer(dying.worker_id)[:4])]  # Accepted, 3 tokens
    relayed = []
    with pytest.raises(WorkerLost) as caught:
        async for event in stubs.stream(await stubs.lease_on(dying)):
            relayed.append(event)
    assert [type(e) for e in relayed] == [Accepted, Token, Token, Token]
    assert caught.value.code == "worker_lost" and caught.value.status == 502
    assert sum(w.generate_calls for w in stubs.workers) == 1  # no retry after output
    assert stubs.replica(dying).in_flight == 0


async def test_closing_the_stream_early_releases_the_lease(stubs):
    holding = stubs.workers[0]
    holding.replies = [Reply(answer(holding.worker_id), hold_after=2)]  # Accepted, a token
    events = stubs.stream(await stubs.lease_on(holding))
    assert isinstance(await anext(events), Accepted)
    assert isinstance(await anext(events), Token)
    assert stubs.replica(holding).in_flight == 1
    await events.aclose()  # the client went away
    assert stubs.replica(holding).in_flight == 0
    holding.release.set()


async def test_closing_a_stream_that_never_started_releases_its_lease(stubs):
    # a client gone before its response began, or a fan-out closed before its other choices ran: the
    # relay never ran, so no `finally` of its own could give the lease back
    idle = stubs.workers[0]
    events = stubs.stream(await stubs.lease_on(idle))
    assert stubs.replica(idle).in_flight == 1
    await events.aclose()
    assert stubs.replica(idle).in_flight == 0 and idle.generate_calls == 0
    await events.aclose()  # twice is once
    assert stubs.replica(idle).in_flight == 0


async def test_an_ejection_doubles_while_the_replica_keeps_failing_and_ends_after_a_success(stubs):
    flaky = stubs.workers[0]
    fail(flaky, "unavailable")
    replica = stubs.replica(flaky)
    # each ejection starts while its stream runs: its end is judged against the stream's start and end, which
    # holds however long a loaded machine takes over the stream
    before = time.monotonic()
    await collect(stubs.stream(await stubs.lease_on(flaky), ejection_s=0.1))
    assert before + 0.1 <= replica.ejected_until <= time.monotonic() + 0.1
    await asyncio.sleep(0.15)
    assert replica.available(time.monotonic())
    before = time.monotonic()
    await collect(stubs.stream(await stubs.lease_on(flaky), ejection_s=0.1))
    assert before + 0.2 <= replica.ejected_until <= time.monotonic() + 0.2  # doubled
    await asyncio.sleep(0.25)
    flaky.replies = [Reply(answer(flaky.worker_id))]
    await collect(stubs.stream(await stubs.lease_on(flaky), ejection_s=0.1))
    assert replica.ejections == 0


async def test_a_call_with_one_answer_fails_over_by_the_same_rules(stubs):
    # a tokenizer call: unreachable -> ejected and retried, overloaded -> retried but not ejected, the last error
    stubs.workers[0].tokenizer_refusal = FAILURES["refuse"]
    stubs.workers[1].tokenizer_refusal = FAILURES["overloaded"]
    for worker in stubs.workers[2:]:
        stubs.replica(worker).draining = True
    deadline = time.monotonic() + START_S
    answers = failover(lambda replica: exchange(replica, "/tokenize", b'{"text": "hi"}'),
                       await stubs.lease_on(stubs.workers[0]),
                       reacquire=lambda tried: stubs.activator.acquire(deadline, tried), ejection_s=30.0)
    with pytest.raises(Overloaded):
        await collect(answers)
    assert stubs.replica(stubs.workers[0]).ejected_until > time.monotonic()
    assert stubs.replica(stubs.workers[1]).ejected_until == 0
    assert all(r.in_flight == 0 for r in stubs.pool.replicas)
