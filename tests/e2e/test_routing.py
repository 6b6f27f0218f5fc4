"""Routing across several real worker processes (a tiny random Llama with SmolLM2's tokenizer, so they load
and decode quickly): concurrent requests spread to the least loaded replicas, and a replica that fails
before the first token is skipped for another one, whether it drops the connection, answers "overloaded",
or is killed. Which worker served a request is read from the usage records (`worker_id`).

A protocol stub plays the failing replica where the failure must be certain: it answers `/load` and `/info`
like a healthy idle worker, so the gateway tries it first, and fails every `/generate`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter

import httpx
import pytest

from testkit.protocol_worker import Reply, protocol_worker
from testkit.sluice import running_sluice, standalone_worker_process
from testkit.tiny_model import write_tiny_model

pytestmark = pytest.mark.slow
ADMIN_KEY = "routing-test-admin-key-0123456789abcdef"
WORKERS = ("w1", "w2", "w3")


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """A random two-layer Llama with SmolLM2's tokenizer, as a plain HF directory."""
    return write_tiny_model(tmp_path_factory.mktemp("tiny-llama"), tied=False, positions=4096)


@pytest.fixture(scope="module")
def stub():
    """A replica that looks healthy and idle and fails every generation, as its `replies` say."""
    with protocol_worker(model="stub", worker_id="stub", max_context=4096, free_cache_tokens=100_000,
                         vocab_size=49152, replies=[Reply.dropped()]) as worker:
        yield worker


@pytest.fixture(scope="module")
def workers(tmp_path_factory, tiny_model_dir):
    model = {"source": str(tiny_model_dir), "threads": 1, "decode_threads": 1, "max_context": 4096}
    with contextlib.ExitStack() as stack:
        yield {name: stack.enter_context(standalone_worker_process(tmp_path_factory.mktemp(name), worker_id=name,
                                                                   **model))
               for name in WORKERS}


@pytest.fixture(scope="module")
def sluice_on_workers(tmp_path_factory, workers, stub):
    urls = [url for url, _ in workers.values()]
    failover = [stub.url, urls[0]]
    config = (f'[[models]]\nname = "tiny"\nprovisioner = {{ kind = "static", urls = {json.dumps(urls)} }}\n'
              f'[[models]]\nname = "tiny-failover"\n'
              f'provisioner = {{ kind = "static", urls = {json.dumps(failover)} }}\n')
    with running_sluice(tmp_path_factory.mktemp("gateway"), config=config,
                        env={"SLUICE_ADMIN_KEY": ADMIN_KEY}) as server:
        yield server


def complete(sluice_on_workers, model: str, count: int, max_tokens: int) -> list[httpx.Response]:
    async def all_at_once():
        async with httpx.AsyncClient(timeout=120) as client:
            return await asyncio.gather(*(client.post(f"{sluice_on_workers.url}/v1/completions", headers=bearer(),
                                                      json={"model": model, "prompt": f"Request {i}",
                                                            "max_tokens": max_tokens, "min_tokens": max_tokens})
                                          for i in range(count)))

    return asyncio.run(all_at_once())


def bearer() -> dict:
    return {"authorization": f"Bearer {ADMIN_KEY}"}


def served_by(sluice_on_workers, model: str, expected: int) -> list[str]:
    """The worker of every successful request of `model` so far, oldest first, once the ledger holds
    `expected` of them (records reach the database from the ledger's write-ahead log in batches)."""
    deadline = time.monotonic() + 60
    while True:
        records = httpx.get(f"{sluice_on_workers.url}/admin/usage/records", headers=bearer(), timeout=30).json()["data"]
        found = [r["worker_id"] for r in sorted(records, key=lambda r: r["time"])
                 if r["model"] == model and r["status"] == "ok"]
        if len(found) >= expected or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def test_concurrent_requests_spread_over_the_least_loaded_replicas(sluice_on_workers):
    replies = complete(sluice_on_workers, "tiny", 6, max_tokens=300)
    assert [reply.status_code for reply in replies] == [200] * 6, [r.text for r in replies]
    spread = Counter(served_by(sluice_on_workers, "tiny", 6))
    # each request is counted on its replica from the moment it is sent, so six overlapping requests
    # spread two by two; "first healthy replica" would have put all six on one
    assert set(spread) == set(WORKERS) and max(spread.values()) <= 3, spread


def test_a_replica_that_drops_the_connection_is_skipped_for_another(sluice_on_workers, stub):
    stub.generate_calls, stub.replies = 0, [Reply.dropped()]  # as a crashed worker: no answer
    replies = complete(sluice_on_workers, "tiny-failover", 3, max_tokens=4)
    assert [reply.status_code for reply in replies] == [200] * 3, [r.text for r in replies]
    assert stub.generate_calls >= 1  # the idle-looking stub was tried first
    assert served_by(sluice_on_workers, "tiny-failover", 3) == ["w1"] * 3


def test_an_overloaded_replica_is_skipped_for_another(sluice_on_workers, stub):
    stub.generate_calls, stub.replies = 0, [Reply.refused(429, "overloaded", "queue full")]
    before = len(served_by(sluice_on_workers, "tiny-failover", 3))
    sent = 0
    # one at a time, so the stub is the least loaded every time once it is back from the ejection that the
    # dropped connections of the test before earned it (an overloaded answer ejects nobody)
    deadline = time.monotonic() + 120
    while stub.generate_calls < 3 and time.monotonic() < deadline:
        reply = complete(sluice_on_workers, "tiny-failover", 1, max_tokens=4)[0]
        assert reply.status_code == 200, reply.text
        sent += 1
        if stub.generate_calls == 0:
            time.sleep(0.5)
    assert stub.generate_calls >= 3
    assert served_by(sluice_on_workers, "tiny-failover", before + sent)[before:] == ["w1"] * sent


def test_a_killed_worker_is_routed_around(sluice_on_workers, workers):
    _, process = workers["w3"]
    process.kill()
    process.wait(timeout=20)
    before = len(served_by(sluice_on_workers, "tiny", 6))
    replies = complete(sluice_on_workers, "tiny", 6, max_tokens=4)  # at once: the gateway may not have polled yet
    assert [reply.status_code for reply in replies] == [200] * 6, [r.text for r in replies]
    after = served_by(sluice_on_workers, "tiny", before + 6)[before:]
    assert len(after) == 6 and set(after) <= {"w1", "w2"}, after
    assert httpx.get(f"{sluice_on_workers.url}/health", timeout=10).status_code == 200  # the model still has replicas
