"""Elastic endpoints under load and faults, through one real `sluice serve` (the local provisioner, real worker
processes of the tiny random model, short scaling windows): sustained load scales 1 -> 2 replicas; the
autoscaler's scale-down back to one while 8 streams run cuts none (a scale to zero once idle is
tests/e2e/test_serverless.py's); a SIGKILLed worker's waiting requests are served by the
replica started in its place while its running stream ends with the dialect's error event, recorded once;
SIGTERM drains: new requests get a 503, the running streams finish, the process exits 0.

To hold a stream mid-flight whatever the machine's speed, a test stops the worker (SIGSTOP) once the
client has its first tokens and lets it go on (SIGCONT) after the fault; the gateway sees a slow replica.
The tests share the server and run in file order: the last one shuts it down."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Callable

import httpx
import pytest

from testkit.admin import admin_headers
from testkit.sluice import SluiceServer, pid_alive, start_sluice
from testkit.tiny_model import write_tiny_model

pytestmark = pytest.mark.slow
ELASTIC = "tiny/elastic"
WORKER = 'threads = 1\ndecode_threads = 1\nmax_context = 512\n'
SCALING = ('[scaling]\nstable_window_seconds = 2\npanic_window_seconds = 1\ntick_seconds = 0.1\n'
           'health_interval_seconds = 0.2\nejection_seconds = 0.5\n')
WAIT_S = 300  # the longest any step waits (a worker start on two loaded cores); a passing run takes seconds


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> SluiceServer:
    tiny = write_tiny_model(tmp_path_factory.mktemp("tiny-llama"))
    config = (f'[[models]]\nname = "{ELASTIC}"\nsource = "{tiny}"\n{WORKER}max_batch_size = 8\n'
              'min_replicas = 1\nmax_replicas = 2\ntarget_concurrency = 2\ndrain_seconds = 60\n' + SCALING)
    server = start_sluice(tmp_path_factory.mktemp("sluice"), config=config, env={"SLUICE_SHUTDOWN_GRACE_SECONDS": "5"})
    yield server
    server.stop()


def status(server: SluiceServer, name: str) -> dict:
    return httpx.get(f"{server.url}/admin/endpoints/{name}", headers=admin_headers(server), timeout=10).json()


def until(condition: Callable[[], object], what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(0.05)


def live_workers(server: SluiceServer, model: str) -> list[int]:
    return [e["pid"] for e in server.log_events("worker_started") if e["model"] == model and pid_alive(e["pid"])]


def records(server: SluiceServer, request_ids: set[str]) -> list[dict]:
    """The ledger's records of these requests, once all have shipped to the database."""
    found: list[dict] = []

    def shipped() -> bool:
        found[:] = [r for r in httpx.get(f"{server.url}/admin/usage/records?limit=1000", headers=admin_headers(server),
                                         timeout=10).json()["data"] if r["request_id"] in request_ids]
        return len({r["request_id"] for r in found}) == len(request_ids)

    until(shipped, "the ledger's records")
    return found


class Stream:
    """One streamed OpenAI completion, read event by event; `logprobs` names every token delivered. It runs
    to `max_tokens` (ignore_eos): a random model's greedy path may meet EOS in one batch and not in another."""

    def __init__(self, client: httpx.AsyncClient, model: str, max_tokens: int):
        self.client, self.model, self.max_tokens = client, model, max_tokens
        self.tokens = 0
        self.events: list[dict] = []
        self.done = False
        self.request_id = ""
        self.status = 0
        self.first = asyncio.Event()

    async def run(self) -> Stream:
        body = {"model": self.model, "prompt": "Once upon a time", "max_tokens": self.max_tokens, "stream": True,
                "logprobs": 1, "temperature": 0, "ignore_eos": True}
        async with self.client.stream("POST", "/v1/completions", json=body, timeout=WAIT_S) as reply:
            self.status, self.request_id = reply.status_code, reply.headers["x-request-id"]
            async for line in reply.aiter_lines():
                if line == "data: [DONE]":
                    self.done = True
                elif line.startswith("data: "):
                    event = json.loads(line.removeprefix("data: "))
                    self.events.append(event)
                    for choice in event.get("choices", []):
                        self.tokens += len((choice.get("logprobs") or {}).get("tokens", []))
                    if self.tokens:
                        self.first.set()
        self.first.set()
        return self

    @property
    def finish_reason(self) -> str | None:
        return next((c["finish_reason"] for e in self.events for c in e.get("choices", []) if c["finish_reason"]),
                    None)

    @property
    def error(self) -> dict | None:
        return next((e["error"] for e in self.events if "error" in e), None)


@contextlib.contextmanager
def stopped(pids: list[int]):
    """The workers frozen (their streams stay mid-flight) until the block ends."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def client(server: SluiceServer) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=server.url, headers={"authorization": f"Bearer {server.api_key}"},
                             timeout=WAIT_S, limits=httpx.Limits(max_connections=100))


def test_sustained_load_scales_up_then_the_autoscaler_scales_down_during_8_streams_and_cuts_none(server):
    first = live_workers(server, ELASTIC)
    assert len(first) == 1 and status(server, ELASTIC)["replicas"]["ready"] == 1

    async def load_then_streams() -> list[Stream]:
        stop = asyncio.Event()

        async def one(http: httpx.AsyncClient) -> None:
            while not stop.is_set():
                await Stream(http, ELASTIC, 16).run()

        async with client(server) as http:
            # 6 clients, target 2 per replica: the autoscaler wants 2 replicas (max_replicas)
            clients = [asyncio.create_task(one(http)) for _ in range(6)]
            while status(server, ELASTIC)["replicas"]["ready"] < 2:
                await asyncio.sleep(0.1)
            stop.set()
            await asyncio.gather(*clients)
            assert len(live_workers(server, ELASTIC)) == 2, server.log_events("worker_started")
            # the load is over; 8 long streams run on the two replicas, held mid-flight
            # (400 tokens: long enough that none ends before the last one has its first token)
            streams = [Stream(http, ELASTIC, 400) for _ in range(8)]
            tasks = [asyncio.create_task(s.run()) for s in streams]
            await asyncio.gather(*(s.first.wait() for s in streams))
            with stopped(live_workers(server, ELASTIC)):
                assert not any(s.done for s in streams), [s.tokens for s in streams]
                assert status(server, ELASTIC)["in_flight"] == 8, status(server, ELASTIC)
                # 8 in flight now fit one replica: once its stable window agrees, the autoscaler drains one
                patched = await http.patch(f"/admin/endpoints/{ELASTIC}", headers=admin_headers(server),
                                           json={"target_concurrency": 8})
                assert patched.status_code == 200
                while status(server, ELASTIC)["replicas"]["draining"] != 1:
                    await asyncio.sleep(0.05)
                assert status(server, ELASTIC)["in_flight"] == 8  # the drained replica still holds its streams
            return await asyncio.gather(*tasks)

    streams = asyncio.run(asyncio.wait_for(load_then_streams(), WAIT_S))
    for stream in streams:  # every stream ran to its end
        assert stream.status == 200 and stream.done and stream.error is None and stream.finish_reason, stream.events
    until(lambda: status(server, ELASTIC)["replicas"] == {"ready": 1, "starting": 0, "draining": 0}, "one replica")
    until(lambda: len(live_workers(server, ELASTIC)) == 1, "the drained replica's exit")
    ledger = records(server, {s.request_id for s in streams})
    assert len(ledger) == 8 and {r["status"] for r in ledger} == {"ok"}  # each exactly once
    by_id = {r["request_id"]: r for r in ledger}
    assert all(by_id[s.request_id]["completion_tokens"] == s.tokens for s in streams)


def test_sigkill_of_a_worker_moves_its_waiting_requests_and_ends_its_stream_with_an_error(server):
    [doomed] = live_workers(server, ELASTIC)  # its only replica now (one is enough at target 8)

    async def kill_with_requests_waiting() -> tuple[Stream, list[httpx.Response]]:
        async with client(server) as http:
            running = Stream(http, ELASTIC, 400)
            streaming = asyncio.create_task(running.run())
            await running.first.wait()
            with stopped([doomed]):  # mid-stream; four more requests wait for their first token
                waiting = [asyncio.create_task(http.post("/v1/completions", json={
                    "model": ELASTIC, "prompt": f"request {i}", "max_tokens": 4})) for i in range(4)]
                while status(server, ELASTIC)["in_flight"] + status(server, ELASTIC)["waiting"] < 5:
                    await asyncio.sleep(0.05)
                os.kill(doomed, signal.SIGKILL)
            return await streaming, await asyncio.gather(*waiting)

    stream, answers = asyncio.run(asyncio.wait_for(kill_with_requests_waiting(), WAIT_S))
    # the stream: the tokens it had, then the dialect's error event, never a normal end
    assert stream.status == 200 and 0 < stream.tokens < 400 and stream.finish_reason is None
    assert stream.error is not None and stream.error["code"] == "worker_lost", stream.events[-3:]
    # the waiting requests: none lost; served by the replica started in the killed one's place
    assert [a.status_code for a in answers] == [200] * 4, [a.text for a in answers]
    [replacement] = live_workers(server, ELASTIC)
    assert replacement != doomed and not pid_alive(doomed)
    ledger = records(server, {stream.request_id} | {a.headers["x-request-id"] for a in answers})
    assert len(ledger) == 5
    lost = next(r for r in ledger if r["request_id"] == stream.request_id)
    assert (lost["status"], lost["error_code"], lost["completion_tokens"]) == ("error", "worker_lost", stream.tokens)
    assert sorted(r["status"] for r in ledger if r is not lost) == ["ok"] * 4


def test_sigterm_drains_then_exits_zero(server):
    """Last: it stops the module's server."""

    async def drain() -> tuple[list[Stream], httpx.Response, httpx.Response]:
        async with client(server) as http:
            streams = [Stream(http, ELASTIC, 100) for _ in range(3)]
            tasks = [asyncio.create_task(s.run()) for s in streams]
            await asyncio.gather(*(s.first.wait() for s in streams))
            with stopped(live_workers(server, ELASTIC)):  # the streams stay in flight through the signal
                server.process.send_signal(signal.SIGTERM)
                while not server.log_events("gateway_draining"):
                    await asyncio.sleep(0.05)
                refused = await http.post("/v1/completions", json={"model": ELASTIC, "prompt": "hi", "max_tokens": 2})
                health = await http.get("/health")
            return await asyncio.gather(*tasks), refused, health

    streams, refused, health = asyncio.run(asyncio.wait_for(drain(), WAIT_S))
    assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
    error = refused.json()["error"]
    assert (error["code"], error["endpoint_state"]) == ("endpoint_draining", "draining"), error
    assert health.status_code == 503  # a load balancer takes the draining gateway out
    for stream in streams:  # the streams in flight at the signal finished
        assert stream.status == 200 and stream.done and stream.error is None and stream.finish_reason
    assert server.wait_exit(WAIT_S) == 0
    done = {e["request_id"]: e["status"] for e in server.log_events("request_done")}
    assert all(done[s.request_id] == "ok" for s in streams)
    assert not any(pid_alive(e["pid"]) for e in server.log_events("worker_started"))
