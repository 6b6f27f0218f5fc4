"""Endpoints through `sluice serve` (the local provisioner, real worker processes, the tiny random model):
20 concurrent requests to an endpoint at zero replicas start one worker and all succeed with their wait
recorded; a refusal while an endpoint wakes is a 503 with Retry-After and the endpoint's state in each
dialect's envelope."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from tests.fixtures.sluice import running_sluice
from tests.fixtures.tiny_model import write_tiny_model

pytestmark = pytest.mark.slow
WORKER = 'threads = 1\ndecode_threads = 1\nmax_batch_size = 8\nmax_context = 256\n'


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


def endpoint(name: str, source: Path | str, **fields) -> str:
    lines = "".join(f"{key} = {value}\n" for key, value in fields.items())
    return f'[[models]]\nname = "{name}"\nsource = "{source}"\n{WORKER}{lines}'


async def complete(client: httpx.AsyncClient, model: str, index: int, headers: dict | None = None) -> httpx.Response:
    return await client.post("/v1/completions", headers=headers or {}, timeout=300,
                             json={"model": model, "prompt": f"request {index}", "max_tokens": 4})


def test_twenty_requests_at_zero_start_one_worker_and_all_succeed(tmp_path, tiny):
    config = endpoint("tiny/llama", tiny, min_replicas=0, max_replicas=1, idle_seconds=600)
    with running_sluice(tmp_path, config=config) as server:
        assert server.worker_pids() == []  # healthy while asleep: nothing was started
        health = httpx.get(f"{server.url}/health").json()
        assert health["endpoints"] == {"tiny/llama": "scaled_to_zero"}

        async def burst() -> list[httpx.Response]:
            headers = {"authorization": f"Bearer {server.api_key}"}
            async with httpx.AsyncClient(base_url=server.url, headers=headers) as client:
                return await asyncio.gather(*(complete(client, "tiny/llama", i) for i in range(20)))

        responses = asyncio.run(burst())
        assert [r.status_code for r in responses] == [200] * 20, responses[0].text
        assert len(server.worker_pids()) == 1
        done = [e for e in server.log_events("request_done") if e.get("status") == "ok"]
        assert len(done) == 20 and all(e["cold_start_ms"] > 0 for e in done)
        assert httpx.get(f"{server.url}/health").json()["endpoints"] == {"tiny/llama": "ready"}


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
        again = httpx.post(f"{server.url}/v1/completions/generate", headers=auth, timeout=5,
                           json={"model": "org/broken", "inputs": "hi", "parameters": {"max_new_tokens": 2}})
        assert again.status_code == 503 and again.json()["endpoint_state"] == "failed"
        assert "cannot load model" in again.json()["endpoint_reason"] and "retry-after" in again.headers
        assert httpx.get(f"{server.url}/health").status_code == 503  # a failed endpoint is not healthy
