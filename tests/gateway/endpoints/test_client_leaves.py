"""A client that leaves while its request waits for a replica, driven through the real gateway app with an
ASGI `receive` the test controls: its place in the endpoint's queue is freed when it leaves (not when a
replica comes, the wait runs out or a generator is collected), it is recorded as cancelled with nothing
billed, and its concurrency slot is given back. The endpoint is a static one whose only worker address
answers nothing, so it stays `starting` and every request waits."""

from __future__ import annotations

import asyncio
import json

import pytest

from gateway.config import Settings
from gateway.endpoints.spec import parse_endpoint
from testkit.servers import free_port
from tests.gateway.app_client import ADMIN_HEADERS, ADMIN_KEY, app_client, new_key

MODEL = "remote/asleep"


@pytest.fixture
async def app_without_replicas(tmp_path):
    static = {"kind": "static", "urls": [f"http://127.0.0.1:{free_port()}"]}
    spec = parse_endpoint({"name": MODEL, "provisioner": static, "max_wait_seconds": 120})
    async with app_client(Settings(data_dir=str(tmp_path), models=[spec], admin_key=ADMIN_KEY)) as client:
        yield client


async def waiting(client) -> int:
    status = await client.get(f"/admin/endpoints/{MODEL}", headers=ADMIN_HEADERS)
    return status.json()["waiting"]


async def until(condition, what: str, timeout: float = 120.0) -> None:
    """Polls `condition` (a coroutine function); the timeout only bounds a failing test."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await condition():
        assert loop.time() < deadline, f"{what} did not happen"
        await asyncio.sleep(0.02)


def scope(headers: dict[str, str], body: bytes) -> dict:
    raw = [(k.encode(), v.encode()) for k, v in {**headers, "content-type": "application/json",
                                                 "content-length": str(len(body))}.items()]
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"", "headers": raw,
            "client": ("127.0.0.1", 5000), "server": ("test", 80), "root_path": "", "state": {}}


@pytest.mark.parametrize("stream", [False, True])
async def test_a_client_that_leaves_while_waiting_frees_its_place_at_once(app_without_replicas, stream):
    headers = await new_key(app_without_replicas, limits={"max_concurrency": 1})
    body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 2, "stream": stream}).encode()
    left = asyncio.Event()
    sent: list[dict] = []

    async def receive():
        if not sent:
            sent.append({"type": "http.request"})
            return {"type": "http.request", "body": body, "more_body": False}
        await left.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    call = asyncio.create_task(app_without_replicas.app(scope(headers, body), receive, send))
    await until(lambda: _is(app_without_replicas, 1), "the request's wait")
    left.set()  # long before the wait's end (120 s) or a stream's first keep-alive (10 s)
    await until(lambda: _is(app_without_replicas, 0), "its leaving the queue")
    await until(lambda: _done(call), "the end of the request")  # polled: the app runs outside the client
    assert not any(m.get("body") for m in sent if m["type"] == "http.response.body")  # nothing was written
    # recorded as cancelled, nothing billed; its concurrency slot is free again: the next request meets the
    # endpoint (503), not the team's limit (429)
    again = await app_without_replicas.post("/v1/completions", headers={**headers, "x-scale-up-timeout": "0"},
                               json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
    assert again.status_code == 503 and again.json()["error"]["code"] == "scale_up_timeout", again.text
    records = (await app_without_replicas.get("/admin/usage/records?limit=10", headers=ADMIN_HEADERS)).json()["data"]
    assert all(r["status"] != "ok" and r["completion_tokens"] == 0 for r in records)


async def _is(client, count: int) -> bool:
    return await waiting(client) == count


async def _done(task: asyncio.Task) -> bool:
    return task.done()
