"""Every worker call goes through the one leased worker client (gateway/serving/worker_client.py), shown through a
real `sluice serve` in front of protocol workers:

- the tokenizer calls (TGI's and SGLang's `/tokenize`, `/detokenize`, Anthropic's `count_tokens`) on an endpoint
  scaled to zero wait in its activator queue, where the controller sees them as demand and wakes it, then answer
  200; the public routes (`/get_model_info`, `/health_generate`) wake nothing;
- a tokenizer call's wait ends as a generation's: at the caller's `X-Scale-Up-Timeout` (a bad value is a 400),
  and at once when its client disconnects (it leaves the queue and never reaches the worker);
- a tokenizer call on a replica counts in the endpoint's in-flight load;
- a replica that refuses a tokenizer call before answering is ejected and the call answered by another.

The scaled-to-zero endpoint is an ECS service in moto whose tasks the played agent runs as protocol workers
(testkit/played_ecs.py); it holds each task's worker back until the test lets it start.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import re
import threading
import time
from collections.abc import Iterator
from unittest import mock

import httpx
import pytest

from testkit.local_aws import moto_server
from testkit.played_ecs import PlayedEcs, TaskWorker, ecs_service, manual_task_states, provisioner_toml
from testkit.protocol_worker import MODEL, Reply, protocol_worker
from testkit.sluice import SluiceServer, running_sluice

ADMIN_KEY = "worker-client-tests-admin-key-0123456789"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
SCALING = """[scaling]
stable_window_seconds = 4
panic_window_seconds = 1
tick_seconds = 0.1
health_interval_seconds = 0.2
standby_worker = false

"""
WAIT_S = 90  # the longest a condition is waited for (a hang fails; two shared cores)
SPANS = [{"id": 0, "text": "Hi", "start": 0, "stop": 2}, {"id": 1, "text": "there", "start": 3, "stop": 8}]
# (path, body, answer): every tokenizer call of every dialect
CALLS = [("/tokenize", {"inputs": "Hi there"}, SPANS),
         ("/tokenize", {"text": "Hi there"}, {"tokens": [0, 1], "count": 2, "max_model_len": 2048}),
         ("/detokenize", {"tokens": [5, 7]}, {"text": "<5> <7>"}),
         ("/v1/messages/count_tokens", {"model": MODEL, "messages": [{"role": "user", "content": "Hi there"}]},
          {"input_tokens": 2})]


async def until(condition, what: str, timeout: float = WAIT_S):
    """The first true value of `condition()` (awaited when it is a coroutine)."""
    deadline = time.monotonic() + timeout
    while not (value := await _value(condition())):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not hold within {timeout} s")
        await asyncio.sleep(0.05)
    return value


async def _value(value):
    return await value if inspect.isawaitable(value) else value


async def endpoint_status(client: httpx.AsyncClient) -> dict:
    return (await client.get(f"/admin/endpoints/{MODEL}", headers=ADMIN)).json()


def metric(text: str, name: str) -> float:
    found = re.search(rf'^{name}\{{endpoint="{re.escape(MODEL)}"\}} (\S+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


class HeldWorkers:
    """What the played agent runs for each task: a protocol worker, started only once `go` is set."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.started: list = []

    def __call__(self, task: dict) -> TaskWorker:
        self.go.wait(WAIT_S)
        stack = contextlib.ExitStack()
        worker = stack.enter_context(protocol_worker())
        self.started.append(worker)
        return TaskWorker(worker.url, f"task-{task['taskArn'].rsplit('/', 1)[-1][:8]}",
                          lambda wait: stack.close(), worker)


@pytest.fixture
def asleep(tmp_path) -> Iterator[tuple[SluiceServer, PlayedEcs, HeldWorkers]]:
    """`sluice serve` with one endpoint, MODEL, an ECS service at zero tasks."""
    held = HeldWorkers()
    address_map = tmp_path / "addresses.json"
    with mock.patch.dict(os.environ, AWS_ENV), moto_server() as moto_url:
        manual_task_states(moto_url)
        with ecs_service(moto_url) as (ecs, network), \
                PlayedEcs(ecs, network, held, address_map=address_map) as played:
            config = SCALING + f'''[[models]]
name = "{MODEL}"
min_replicas = 0
max_replicas = 1
idle_seconds = 600
max_wait_seconds = {WAIT_S}

''' + provisioner_toml(moto_url, address_map)
            try:
                with running_sluice(tmp_path / "gateway", config=config,
                                    env={**AWS_ENV, "SLUICE_ADMIN_KEY": ADMIN_KEY}) as server:
                    yield server, played, held
            finally:
                held.go.set()  # a task still held back lets the played agent's thread end


async def test_tokenizer_calls_wake_an_endpoint_at_zero_and_count_as_its_demand(asleep):
    server, played, held = asleep
    key = {"authorization": f"Bearer {server.api_key}"}
    async with httpx.AsyncClient(base_url=server.url, timeout=WAIT_S) as client:
        assert (await endpoint_status(client))["state"] == "scaled_to_zero"
        # the public routes start no worker: model info is the endpoint's, the probe takes only a ready replica
        info = await client.get("/get_model_info")
        assert info.status_code == 200 and info.json()["model_path"] == MODEL, info.text
        assert (await client.get("/health_generate")).status_code == 503
        await asyncio.sleep(1.0)  # ten ticks of the endpoint's loop: time to scale up, had they counted
        status = await endpoint_status(client)
        assert status["state"] == "scaled_to_zero" and status["desired_replicas"] == 0, status
        assert played.desired_seen == [0]

        calls = [asyncio.ensure_future(client.post(path, json=body, headers=key)) for path, body, _ in CALLS]
        # every call waits in the activator's queue: the endpoint's demand, which starts a task
        waiting = await until(lambda: _waiting(client, len(CALLS)), "the calls waiting")
        assert waiting["state"] == "starting" and waiting["desired_replicas"] == 1, waiting
        assert metric((await client.get("/metrics", headers=ADMIN)).text, "sluice_endpoint_queue_depth") == len(CALLS)
        await until(lambda: played.desired_seen[-1] == 1, "the service's desired count of 1")
        held.go.set()  # the task's worker starts
        replies = await asyncio.gather(*calls)
    for reply, (path, _, answer) in zip(replies, CALLS):
        assert reply.status_code == 200 and reply.json() == answer, (path, reply.text)
    (worker,) = held.started
    assert sorted(worker.tokenizer_calls) == ["/detokenize", "/tokenize", "/tokenize", "/tokenize"]  # count_tokens too
    async with httpx.AsyncClient(base_url=server.url, timeout=WAIT_S) as client:
        status = await endpoint_status(client)
    assert status["state"] == "ready" and status["waiting"] == 0 and status["in_flight"] == 0, status


async def _waiting(client: httpx.AsyncClient, count: int) -> dict | None:
    status = await endpoint_status(client)
    return status if status["waiting"] == count else None


async def test_a_tokenizer_call_waits_no_longer_than_the_callers_scale_up_timeout(asleep):
    server, _, _ = asleep
    key = {"authorization": f"Bearer {server.api_key}"}
    async with httpx.AsyncClient(base_url=server.url, timeout=WAIT_S) as client:
        # the endpoint waits up to max_wait_seconds (WAIT_S): each call gives up at its own header's second
        replies = await asyncio.gather(*(client.post(path, json=body, headers={**key, "x-scale-up-timeout": "1"})
                                         for path, body, _ in CALLS))
        for reply, (path, _, _) in zip(replies, CALLS):
            assert reply.status_code == 503 and "no replica became ready in time" in reply.text, (path, reply.text)
        for path, body, _ in CALLS:
            reply = await client.post(path, json=body, headers={**key, "x-scale-up-timeout": "soon"})
            assert reply.status_code == 400 and "X-Scale-Up-Timeout" in reply.text, (path, reply.text)
        status = await endpoint_status(client)
    assert status["waiting"] == 0 and status["in_flight"] == 0, status


async def test_a_client_that_leaves_a_waiting_tokenizer_call_leaves_the_queue(asleep):
    server, _, held = asleep
    key = {"authorization": f"Bearer {server.api_key}"}
    async with httpx.AsyncClient(base_url=server.url, timeout=WAIT_S) as client:
        async with httpx.AsyncClient(base_url=server.url, timeout=WAIT_S) as leaving:
            calls = [asyncio.ensure_future(leaving.post(path, json=body, headers=key)) for path, body, _ in CALLS]
            await until(lambda: _waiting(client, len(CALLS)), "the calls waiting")
            for call in calls:
                call.cancel()
            await asyncio.gather(*calls, return_exceptions=True)
        # the connections are closed: each call leaves the queue now, not at its wait's end (WAIT_S)
        await until(lambda: _waiting(client, 0), "the calls leaving the queue", timeout=WAIT_S / 3)
        held.go.set()  # the worker the calls asked for starts: a call still queued would reach it
        await until(lambda: _ready(client), "the endpoint ready")
        status = await endpoint_status(client)
    (worker,) = held.started
    assert worker.tokenizer_calls == [] and status["in_flight"] == 0, status


async def _ready(client: httpx.AsyncClient) -> bool:
    return (await endpoint_status(client))["state"] == "ready"


@pytest.fixture
def two_replicas(tmp_path):
    """`sluice serve` with one endpoint on two protocol workers: the first one listed, then the second."""
    with protocol_worker() as first, protocol_worker() as second:
        config = SCALING + (f'[[models]]\nname = "{MODEL}"\n'
                            f'provisioner = {{ kind = "static", urls = ["{first.url}", "{second.url}"] }}\n')
        with running_sluice(tmp_path, config=config, env={"SLUICE_ADMIN_KEY": ADMIN_KEY}) as server:
            yield server, first, second


async def _both_ready(client: httpx.AsyncClient) -> bool:
    return (await endpoint_status(client))["replicas"]["ready"] == 2


async def test_a_replica_that_refuses_a_tokenizer_call_is_ejected_and_another_answers(two_replicas):
    server, first, second = two_replicas
    first.tokenizer_refusal = Reply.refused(503, "unavailable", "the tokenizer is down")
    key = {"authorization": f"Bearer {server.api_key}"}
    async with httpx.AsyncClient(base_url=server.url, timeout=WAIT_S) as client:
        await until(lambda: _both_ready(client), "both replicas ready")
        before = (await client.get("/metrics", headers=ADMIN)).text
        for path, body, answer in CALLS[:3]:
            reply = await client.post(path, json=body, headers=key)
            assert reply.status_code == 200 and reply.json() == answer, (path, reply.text)
        after = (await client.get("/metrics", headers=ADMIN)).text
        status = await endpoint_status(client)
    assert first.tokenizer_calls == ["/tokenize"]  # tried first (least loaded, listed first), then sat out
    assert second.tokenizer_calls == ["/tokenize", "/tokenize", "/detokenize"]
    for name in ("sluice_endpoint_retries_total", "sluice_endpoint_ejections_total"):
        assert metric(after, name) - metric(before, name) == 1, name
    assert status["in_flight"] == 0 and status["waiting"] == 0, status


async def test_a_tokenizer_call_counts_in_the_endpoints_in_flight_load(two_replicas):
    server, first, second = two_replicas
    for worker in (first, second):
        worker.tokenizer_pause_s = 1.5
    key = {"authorization": f"Bearer {server.api_key}"}
    async with httpx.AsyncClient(base_url=server.url, timeout=WAIT_S) as client:
        await until(lambda: _both_ready(client), "both replicas ready")
        call = asyncio.ensure_future(client.post("/detokenize", json={"tokens": [1]}, headers=key))
        await until(lambda: _in_flight(client, 1), "the call in flight")
        reply = await call
        assert reply.status_code == 200 and reply.json() == {"text": "<1>"}, reply.text
        assert (await endpoint_status(client))["in_flight"] == 0


async def _in_flight(client: httpx.AsyncClient, count: int) -> bool:
    return (await endpoint_status(client))["in_flight"] == count
