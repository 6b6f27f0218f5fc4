"""The walking skeleton end to end: `sluice serve` as a subprocess, the real openai SDK, the real model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import openai
import pytest

from testkit.sluice import (
    MODEL,
    pid_alive,
    running_sluice,
    start_sluice,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client(sluice_on_smol):
    return openai.OpenAI(base_url=f"{sluice_on_smol.url}/v1", api_key=sluice_on_smol.api_key, max_retries=0)


def test_sdk_completion_streamed_equals_non_streamed(client, smol_tokenizer):
    prompt = "The capital of France is"
    reply = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0)
    choice = reply.choices[0]
    assert choice.text.strip()
    assert choice.finish_reason in ("length", "stop")
    streamed = ""
    usage = None
    for chunk in client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, stream=True,
                                           stream_options={"include_usage": True}):
        if chunk.choices:
            streamed += chunk.choices[0].text
        if chunk.usage:
            usage = chunk.usage
    assert streamed == choice.text
    assert reply.usage.prompt_tokens == len(smol_tokenizer(prompt).input_ids)
    assert reply.usage.completion_tokens == len(choice.model_extra["tokens"])
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    assert usage.prompt_tokens == reply.usage.prompt_tokens
    assert usage.completion_tokens == reply.usage.completion_tokens


def test_usage_counts_match_tokenizer(sluice_on_smol, smol_tokenizer):
    prompt = "Write one sentence about rivers."
    response = httpx.post(f"{sluice_on_smol.url}/v1/completions", timeout=60,
                          headers={"Authorization": f"Bearer {sluice_on_smol.api_key}"},
                          json={"model": MODEL, "prompt": prompt, "max_tokens": 12, "temperature": 0})
    body = response.json()
    assert response.status_code == 200, body
    choice = body["choices"][0]
    assert body["usage"]["prompt_tokens"] == len(smol_tokenizer(prompt).input_ids)
    assert body["usage"]["completion_tokens"] == len(choice["tokens"]) <= 12
    assert smol_tokenizer.decode(choice["tokens"], skip_special_tokens=True) == choice["text"]


def test_models_and_request_ids(sluice_on_smol, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    first = httpx.get(f"{sluice_on_smol.url}/health")
    second = httpx.get(f"{sluice_on_smol.url}/health")
    assert first.status_code == 200
    assert first.headers["x-request-id"] != second.headers["x-request-id"]


def _post(server, body, key: str | None = "default", raw: bytes | None = None):
    headers = {"content-type": "application/json"}
    if key == "default":
        headers["authorization"] = f"Bearer {server.api_key}"
    elif key is not None:
        headers["authorization"] = f"Bearer {key}"
    content = raw if raw is not None else json.dumps(body).encode()
    return httpx.post(f"{server.url}/v1/completions", headers=headers, content=content, timeout=30)


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"model": "no-such-model", "prompt": "x"}, 404, None),
    ({"prompt": "x"}, 400, "model"),
    ({"model": MODEL, "prompt": "x", "max_tokens": "ten"}, 400, "max_tokens"),
    ({"model": MODEL, "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"model": MODEL, "prompt": "x", "temperature": 3}, 400, "temperature"),
    ({"model": MODEL, "prompt": "x", "top_p": 0}, 400, "top_p"),
    ({"model": MODEL, "prompt": "x", "n": 0}, 400, "n"),
    ({"model": MODEL, "prompt": "x", "n": 2, "best_of": 1}, 400, "best_of"),
    ({"model": MODEL, "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ({"model": MODEL, "prompt": "x", "logprobs": 99}, 400, "logprobs"),
    ({"model": MODEL, "prompt": [], "max_tokens": 2}, 400, "prompt"),
    ({"model": MODEL, "prompt": [1, "a"], "max_tokens": 2}, 400, "prompt"),
    ({"model": MODEL, "prompt": [10**9], "max_tokens": 2}, 400, "prompt"),
    ({"model": MODEL, "prompt": "x", "max_tokens": 10**7}, 400, "max_tokens"),
    ({"model": MODEL}, 400, "prompt"),
])
def test_invalid_requests_get_openai_errors(sluice_on_smol, body, status, param):
    response = _post(sluice_on_smol, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"]
    assert error["type"]
    if param is not None:
        assert error["param"] == param


def test_malformed_json_is_400(sluice_on_smol):
    response = _post(sluice_on_smol, None, raw=b"{not json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_json"
    assert _post(sluice_on_smol, None, raw=b"[1, 2]").status_code == 400


def test_missing_and_invalid_keys_are_401(sluice_on_smol):
    for key in (None, "sk-sluice-nope-nope", "garbage"):
        response = _post(sluice_on_smol, {"model": MODEL, "prompt": "x"}, key=key)
        assert response.status_code == 401
        assert response.json()["error"]["type"] == "authentication_error"


def test_oversized_body_is_413(sluice_on_smol):
    response = _post(sluice_on_smol, {"model": MODEL, "prompt": "x" * (5 * 1024 * 1024)})
    assert response.status_code == 413


def test_sdk_raises_typed_errors(sluice_on_smol):
    bad = openai.OpenAI(base_url=f"{sluice_on_smol.url}/v1", api_key="sk-sluice-bad-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model=MODEL, prompt="x")
    good = openai.OpenAI(base_url=f"{sluice_on_smol.url}/v1", api_key=sluice_on_smol.api_key, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        good.completions.create(model="missing", prompt="x")
    with pytest.raises(openai.BadRequestError):  # OpenAI's 400 for an invalid request
        good.completions.create(model=MODEL, prompt="x", temperature=5)


def test_keys_never_logged(sluice_on_smol):
    _post(sluice_on_smol, {"model": MODEL, "prompt": "hello", "max_tokens": 2})
    _post(sluice_on_smol, {"model": MODEL, "prompt": "hello"}, key="sk-sluice-abcdef123456-secretsecretsecret")
    secret = sluice_on_smol.api_key
    assert sluice_on_smol.output.count(secret) == 1  # the one-time announcement on stdout, never a log line
    assert "secretsecretsecret" not in sluice_on_smol.output
    for line in sluice_on_smol.lines:
        if line.startswith("{"):
            assert "Bearer" not in line and "authorization" not in line.lower()


def test_disconnect_cancels_the_worker_request(sluice_on_smol):
    worker = (sluice_on_smol.worker_url(), sluice_on_smol.worker_headers())
    with httpx.stream("POST", f"{sluice_on_smol.url}/v1/completions",
                      headers={"authorization": f"Bearer {sluice_on_smol.api_key}"},
                      json={"model": MODEL, "prompt": "Count slowly:", "max_tokens": 2000, "stream": True,
                            "temperature": 0.7, "ignore_eos": True}, timeout=30) as response:
        lines = response.iter_lines()  # keep the iterator: dropping it would close the connection early
        for line in lines:
            if line.startswith("data: {"):
                break
        assert wait_for_rows(worker, lambda rows: rows == 1)
    assert wait_for_rows(worker, lambda rows: rows == 0)  # the gateway's disconnect reached the engine


def wait_for_rows(worker: tuple[str, dict[str, str]], condition, timeout: float = 30.0) -> bool:
    """Poll the worker's load (URL, headers with its secret) until `condition(running_rows)` holds (a
    loaded CI box can lag)."""
    url, headers = worker
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition(httpx.get(f"{url}/load", headers=headers).json()["running_rows"]):
            return True
        time.sleep(0.05)
    return False


def test_worker_killed_is_restarted_and_health_recovers(tmp_path):
    with running_sluice(tmp_path / "kill") as server:
        pid = server.worker_pids()[-1]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60  # bounds a failing test only: the loop ends as the gateway notices
        while httpx.get(f"{server.url}/health").status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert httpx.get(f"{server.url}/health").status_code == 503
        assert "no ready worker" in httpx.get(f"{server.url}/health").json()["reason"]
        server.wait_healthy(timeout=120)
        assert len(server.worker_pids()) == 2
        response = _post(server, {"model": MODEL, "prompt": "Hi", "max_tokens": 3})
        assert response.status_code == 200


def test_sigterm_stops_gateway_and_workers(tmp_path):
    server = start_sluice(tmp_path / "term")
    workers = server.worker_pids()
    # uvicorn shuts down gracefully, then re-raises the signal so the exit status reports it
    assert server.stop(signal.SIGTERM) in (0, -signal.SIGTERM)
    assert server.log_events_once("gateway_stopped", bool)  # its last line, read off the pipe a moment later
    deadline = time.monotonic() + 60  # a worker's own shutdown, slow on a loaded machine
    while any(pid_alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(pid_alive(p) for p in workers)


def test_sigkill_of_gateway_leaves_no_orphan_worker(tmp_path):
    server = start_sluice(tmp_path / "orphan")
    workers = server.worker_pids()
    server.stop(signal.SIGKILL)
    deadline = time.monotonic() + 60  # a worker's own shutdown, slow on a loaded machine
    while any(pid_alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(pid_alive(p) for p in workers)


def test_admin_key_from_environment_and_restart_reuses_state(tmp_path):
    admin = "operator-chosen-admin-secret-" + "s" * 16
    data = tmp_path / "env"
    with running_sluice(data, env={"SLUICE_ADMIN_KEY": admin}) as first:
        assert "Sluice admin key" not in first.output
        key = first.api_key
    with running_sluice(data, env={"SLUICE_ADMIN_KEY": admin}) as second:
        assert "API key for team 'default'" not in second.output  # created once, never re-printed
        response = httpx.post(f"{second.url}/v1/completions", headers={"authorization": f"Bearer {key}"},
                              json={"model": MODEL, "prompt": "Hi", "max_tokens": 2}, timeout=60)
        assert response.status_code == 200


def _cli(server, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gateway.cli.main", "--data-dir", str(server.data_dir), *args],
                          capture_output=True, text=True, timeout=120, check=True)


def test_operator_cli_shares_the_servers_database(sluice_on_smol):
    teams = json.loads(_cli(sluice_on_smol, "teams", "list", "--json").stdout)
    default = next(t for t in teams if t["name"] == "default")
    created = json.loads(_cli(sluice_on_smol, "keys", "create", "--name", "ops", "--team-id", default["id"],
                              "--json").stdout)
    headers = {"authorization": f"Bearer {created['key']}"}
    assert httpx.get(f"{sluice_on_smol.url}/v1/models", headers=headers).status_code == 200
    assert created["key"] not in _cli(sluice_on_smol, "keys", "list", "--json").stdout  # shown once, never again
    _cli(sluice_on_smol, "keys", "revoke", created["id"])
    deadline = time.monotonic() + 60  # the 1 s promise has its own test (tests/auth/test_cross_process.py)
    models = f"{sluice_on_smol.url}/v1/models"
    while httpx.get(models, headers=headers).status_code == 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert httpx.get(models, headers=headers).status_code == 401
