"""Endpoints through `sluice serve` (the local provisioner, real worker processes, the tiny random model):
20 concurrent requests to an endpoint at zero replicas start one worker and all succeed with their wait
recorded; a refusal while an endpoint wakes is a 503 with Retry-After and the endpoint's state in each
dialect's envelope."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path

import httpx
import pytest

from testkit.servers import free_port
from testkit.sluice import pid_alive, running_sluice
from testkit.tiny_model import write_tiny_model

pytestmark = pytest.mark.slow
WORKER = 'threads = 1\ndecode_threads = 1\nmax_batch_size = 8\nmax_context = 256\n'


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


def endpoint(name: str, source: Path | str, **fields) -> str:
    lines = "".join(f"{key} = {value}\n" for key, value in fields.items())
    return f'[[models]]\nname = "{name}"\nsource = "{source}"\n{WORKER}{lines}'


def until_listening(server, timeout: float = 120.0) -> None:
    """Up, though not healthy: its endpoint has no ready replica."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{server.url}/health", timeout=2).status_code == 503:
                return
        time.sleep(0.25)
    raise TimeoutError(server.output[-3000:])


async def complete(client: httpx.AsyncClient, model: str, index: int, headers: dict | None = None) -> httpx.Response:
    return await client.post("/v1/completions", headers=headers or {}, timeout=300,
                             json={"model": model, "prompt": f"request {index}", "max_tokens": 4})


def test_twenty_requests_at_zero_start_one_worker_then_idle_stops_it_and_a_request_wakes_it(tmp_path, tiny):
    config = (endpoint("tiny/llama", tiny, min_replicas=0, max_replicas=1, idle_seconds=3)
              + "[scaling]\nstable_window_seconds = 2\npanic_window_seconds = 1\n")
    with running_sluice(tmp_path, config=config) as server:
        assert server.worker_pids() == []  # healthy while asleep: nothing was started
        admin = {"authorization": f"Bearer {server.admin_key}"}  # the endpoints' states are the operator's view
        health = httpx.get(f"{server.url}/health", headers=admin).json()
        assert health["endpoints"] == {"tiny/llama": "scaled_to_zero"}
        headers = {"authorization": f"Bearer {server.api_key}"}

        async def burst(count: int) -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=server.url, headers=headers) as client:
                return await asyncio.gather(*(complete(client, "tiny/llama", i) for i in range(count)))

        responses = asyncio.run(burst(20))
        assert [r.status_code for r in responses] == [200] * 20, responses[0].text
        assert len(server.worker_pids()) == 1
        done = [e for e in server.log_events_once("request_done", lambda found: len(found) >= 20)
                if e.get("status") == "ok"]
        assert len(done) == 20 and all(e["cold_start_ms"] > 0 for e in done)
        waited = {r.headers["x-request-id"] for r in responses}
        deadline = time.monotonic() + 60  # the ledger ships its records to the database in the background
        while True:
            records = httpx.get(f"{server.url}/admin/usage/records?limit=1000",
                                headers={"authorization": f"Bearer {server.admin_key}"}).json()["data"]
            records = [r for r in records if r["request_id"] in waited]
            if len(records) == 20 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert len(records) == 20 and all(r["cold_start_ms"] > 0 for r in records)  # the wait, in the ledger
        metrics = httpx.get(f"{server.url}/metrics", headers={"authorization": f"Bearer {server.admin_key}"}).text
        assert 'sluice_endpoint_cold_start_seconds_count{endpoint="tiny/llama"} 20.0' in metrics

        # idle: the worker process is gone and the endpoint says so; the next request wakes it
        pid = server.worker_pids()[0]
        deadline = time.monotonic() + 120
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not pid_alive(pid)
        assert httpx.get(f"{server.url}/health", headers=admin).json()["endpoints"] == {"tiny/llama": "scaled_to_zero"}
        assert [r.status_code for r in asyncio.run(burst(1))] == [200]
        assert len(server.worker_pids()) == 2


def test_refusals_carry_retry_after_and_the_endpoint_state_in_each_envelope(tmp_path, tiny):
    config = (endpoint("tiny/sleepy", tiny, min_replicas=0, max_replicas=1, idle_seconds=600)
              + endpoint("org/broken", tmp_path / "missing", min_replicas=0, max_replicas=1, max_wait_seconds=600))
    with running_sluice(tmp_path / "data", config=config) as server:
        auth = {"authorization": f"Bearer {server.api_key}"}
        now = {**auth, "x-scale-up-timeout": "0"}
        body = {"prompt": "hi", "max_tokens": 2}
        openai = httpx.post(f"{server.url}/v1/completions", headers=now, json={**body, "model": "tiny/sleepy"})
        assert openai.status_code == 503 and int(openai.headers["retry-after"]) >= 1
        error = openai.json()["error"]
        assert error["code"] == "scale_up_timeout" and error["endpoint_state"] in ("scaled_to_zero", "starting")
        friendli = httpx.post(f"{server.url}/serverless/v1/completions", headers=now,
                              json={**body, "model": "tiny/sleepy"})
        assert friendli.status_code == 503 and "retry-after" in friendli.headers
        assert friendli.json()["error"]["endpoint_state"] in ("starting", "ready")
        tgi = httpx.post(f"{server.url}/v1/completions/generate", headers={**auth, "x-scale-up-timeout": "abc"},
                         json={"model": "tiny/sleepy", "inputs": "hi", "parameters": {"max_new_tokens": 2}})
        assert tgi.status_code == 400 and "X-Scale-Up-Timeout" in tgi.json()["error"]

        # a source that cannot load: the endpoint fails on its first start, then answers at once
        first = httpx.post(f"{server.url}/v1/completions", headers=auth, timeout=300,
                           json={**body, "model": "org/broken"})
        assert first.status_code == 503 and first.json()["error"]["endpoint_state"] == "failed", first.text
        again = httpx.post(f"{server.url}/v1/completions/generate", headers=auth, timeout=60,  # not max_wait's 600
                           json={"model": "org/broken", "inputs": "hi", "parameters": {"max_new_tokens": 2}})
        assert again.status_code == 503 and again.json()["endpoint_state"] == "failed"
        # the tenant's reason is a fixed phrase; the worker's own line is the operator's (its `detail`)
        assert again.json()["endpoint_reason"] == "weights failed to load" and "retry-after" in again.headers
        assert httpx.get(f"{server.url}/health").status_code == 503  # a failed endpoint is not healthy


def test_admin_api_creates_patches_deletes_and_a_restart_keeps_them(tmp_path, tiny):
    config = endpoint("tiny/declared", tiny, min_replicas=0, max_replicas=1)
    name = "HuggingFaceTB/tiny-private"

    admin_key = []  # shown once, by the first start

    def call(server, method: str, path: str, key: str | None = None, **body) -> httpx.Response:
        admin_key[:] = admin_key or [server.admin_key]
        headers = {"authorization": f"Bearer {key or admin_key[0]}"}
        return httpx.request(method, f"{server.url}{path}", headers=headers, json=body or None, timeout=60)

    with running_sluice(tmp_path, config=config) as server:
        team = call(server, "POST", "/admin/teams", name="owners").json()
        owner_key = call(server, "POST", "/admin/keys", name="owner", team_id=team["id"]).json()["key"]
        created = call(server, "POST", "/admin/endpoints", name=name, source=str(tiny), min_replicas=0,
                       max_replicas=2, idle_seconds=60, team_id=team["id"])
        assert created.status_code == 201 and created.json()["state"] == "scaled_to_zero", created.text
        assert call(server, "POST", "/admin/endpoints", name=name, source=str(tiny)).status_code == 409
        bad = call(server, "POST", "/admin/endpoints", name="x/y", source=str(tiny), min_replicas=3, max_replicas=1)
        assert bad.status_code == 422 and "replicas" in bad.json()["error"]["message"]
        patched = call(server, "PATCH", f"/admin/endpoints/{name}", max_replicas=3, idle_seconds=30)
        assert patched.status_code == 200 and patched.json()["spec"]["max_replicas"] == 3
        fixed = call(server, "PATCH", f"/admin/endpoints/{name}", source="elsewhere")
        assert fixed.status_code == 422 and "cannot change" in fixed.json()["error"]["message"]
        assert call(server, "GET", f"/admin/endpoints/{name}", key=server.api_key).status_code in (401, 403)
        # private: the owning team sees and calls it; another team gets the 404 of a model that does not exist
        owned = {e["id"] for e in call(server, "GET", "/v1/endpoints", key=owner_key).json()["data"]}
        others = {e["id"] for e in call(server, "GET", "/v1/endpoints", key=server.api_key).json()["data"]}
        assert owned == {name, "tiny/declared"} and others == {"tiny/declared"}
        hidden = call(server, "POST", "/v1/completions", key=server.api_key, model=name, prompt="hi", max_tokens=2)
        assert hidden.status_code == 404
        assert call(server, "DELETE", "/admin/endpoints/tiny/declared").status_code == 409  # the config's own

    with running_sluice(tmp_path, config=config) as server:  # the store kept it, patched
        kept = call(server, "GET", f"/admin/endpoints/{name}")
        assert kept.status_code == 200 and kept.json()["spec"]["max_replicas"] == 3
        assert call(server, "DELETE", f"/admin/endpoints/{name}").status_code == 204
        assert call(server, "GET", f"/admin/endpoints/{name}").status_code == 404
        assert [e["name"] for e in call(server, "GET", "/admin/endpoints").json()["data"]] == ["tiny/declared"]


def test_a_waiting_stream_gets_keepalive_comments_and_a_client_that_leaves_is_not_billed(tmp_path):
    # a static endpoint whose only replica never answers stays `starting`: requests wait in its queue
    config = (f'[[models]]\nname = "remote/asleep"\nmax_wait_seconds = 25\n'
              f'provisioner = {{ kind = "static", urls = ["http://127.0.0.1:{free_port()}"] }}\n')
    with running_sluice(tmp_path, config=config, wait=False) as server:
        until_listening(server)
        admin = {"authorization": f"Bearer {server.admin_key}"}
        team = httpx.post(f"{server.url}/admin/teams", headers=admin,
                          json={"name": "one-at-a-time", "limits": {"max_concurrency": 1}}).json()
        key = httpx.post(f"{server.url}/admin/keys", headers=admin, json={"name": "k", "team_id": team["id"]}).json()
        headers = {"authorization": f"Bearer {key['key']}"}
        body = {"model": "remote/asleep", "prompt": "hi", "max_tokens": 2, "stream": True}
        with httpx.stream("POST", f"{server.url}/v1/completions", headers=headers, json=body, timeout=60) as reply:
            assert reply.status_code == 200
            lines = [line for line in reply.iter_lines() if line]
        comments = [line for line in lines if line.startswith(":")]
        assert len(comments) >= 2 and lines[:len(comments)] == comments  # every 10 s, before anything else
        error = json.loads(lines[len(comments)].removeprefix("data: "))["error"]
        assert error["code"] == "scale_up_timeout" and error["endpoint_state"] == "starting"

        # leave while waiting: out of the queue, recorded as cancelled with no tokens, the slot given back
        with httpx.stream("POST", f"{server.url}/v1/completions", headers=headers, json=body, timeout=60) as reply:
            assert next(reply.iter_lines()).startswith(":")

        def cancelled() -> list[dict]:
            return [e for e in server.log_events("request_done") if e["status"] == "cancelled"]

        deadline = time.monotonic() + 60  # the gateway hears the hang-up on its own loop: a moment on a busy one
        while not cancelled() and time.monotonic() < deadline:
            time.sleep(0.1)
        status = httpx.get(f"{server.url}/admin/endpoints/remote/asleep", headers=admin).json()
        assert status["waiting"] == 0 and status["state"] == "starting"
        assert len(cancelled()) == 1 and cancelled()[0]["completion_tokens"] == 0
        refused = httpx.post(f"{server.url}/v1/completions", headers={**headers, "x-scale-up-timeout": "0"},
                             json={**body, "stream": False})
        assert refused.status_code == 503  # not 429: the cancelled request's concurrency slot was refunded
