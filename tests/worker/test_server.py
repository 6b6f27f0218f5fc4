"""The worker's HTTP face: tokenizing off the event loop within bounds, and the secret it shares with
its gateway (worker/secret.py, gateway/replicas/trust.py), through real servers and processes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import string
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import msgspec
import pytest
import uvicorn
from litestar.testing import AsyncTestClient

from common.protocol import (
    WORKER_SECRET_ENV,
    WORKER_SECRET_HEADER,
    Done,
    GenerateRequest,
    ModelConfig,
    ModelInfo,
    SamplingParams,
    Token,
    ToolSpec,
)
from gateway.endpoints.provisioners.worker_process import WorkerProcess
from gateway.replicas.pool import ReplicaRouter
from gateway.replicas.relay import attempt
from testkit.servers import free_port
from testkit.sluice import MODEL_CACHE, REPO, pid_alive
from worker.engine.native.build import compiler
from worker.server import MAX_DETOKENIZE_TOKENS, MAX_TOKENIZE_CHARS, create_worker_app

SECRET = "worker-test-secret"
HOLD_S = 120  # longer than /health takes on any machine: a hold that ran out would put the tokenize first


def _info(engine) -> ModelInfo:
    return ModelInfo(model_id="smol", model_dtype="float32", device="cpu", quantization="none", max_context=2048,
                     max_rows=16, vocab_size=engine.vocab_size, eos_token_ids=engine.model_eos)


@pytest.fixture(scope="module")
def app(engine):
    return create_worker_app(engine, _info(engine))


# ---- /tokenize and /detokenize ----


@contextlib.contextmanager
def served(app):
    """The worker app on a real port (uvicorn in a thread), as a gateway reaches a worker."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the worker server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


class _HeldTokenizer:
    """The engine's real tokenizer, held at its first call until the test lets it go: a tokenize on the
    event loop would hold the loop too, so /health could not answer while it waits."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, *args, **kwargs):
        self.entered.set()
        self.release.wait(timeout=HOLD_S)
        return self._tokenizer(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


async def test_a_long_tokenize_does_not_stall_the_event_loop(engine, app, monkeypatch):
    """While a tokenize is in progress, /health is answered. The server runs on this test's own event
    loop: on the loop, the held tokenize held it (and this test) until its hold ran out, and its answer
    came first."""
    held = _HeldTokenizer(engine.tokenizer)
    monkeypatch.setattr(engine, "tokenizer", held)
    text = "".join(random.Random(0).choice(string.ascii_letters) for _ in range(MAX_TOKENIZE_CHARS))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    serving = asyncio.create_task(server.serve())
    order: list[str] = []
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=300) as client:

            async def tokenize() -> bytes:
                async with client.stream("POST", "/tokenize", json={"text": text}) as response:
                    order.append("tokenize answered")
                    return await response.aread()

            tokenizing = asyncio.create_task(tokenize())
            assert await asyncio.to_thread(held.entered.wait, HOLD_S), "the tokenize never reached the tokenizer"
            health = await client.get("/health")
            order.append("health answered")
            held.release.set()
            spans = msgspec.json.decode(await tokenizing)
    finally:
        held.release.set()
        server.should_exit = True
        await serving
    assert health.status_code == 200 and order == ["health answered", "tokenize answered"]
    assert spans[-1]["stop"] == len(text)


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/tokenize", {"text": "x" * (MAX_TOKENIZE_CHARS + 1)}, "text"),
    ("/tokenize", {"messages": [{"role": "user", "content": "y" * MAX_TOKENIZE_CHARS}]}, "messages"),
    ("/tokenize", {"messages": [{"role": 5}]}, "messages"),
    ("/detokenize", {"tokens": [1] * (MAX_DETOKENIZE_TOKENS + 1)}, "tokens"),
])
async def test_tokenize_inputs_are_bounded_with_a_clear_422(app, path, body, field):
    async with AsyncTestClient(app=app) as client:
        response = await client.post(path, json=body)
    assert response.status_code == 422
    assert response.json()["kind"] == "validation" and response.json()["field"] == field


async def test_tokenize_counts_the_prompt_a_generation_of_the_messages_and_tools_prefills(app, engine):
    """Anthropic's count_tokens sends tools: the tool prompt counts, exactly as the generation lays it out."""
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    tools = {"functions": [{"name": "get_weather", "description": "The weather in a city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]}
    async with AsyncTestClient(app=app) as client:
        alone = (await client.post("/tokenize", json={"messages": messages})).json()
        offered = (await client.post("/tokenize", json={"messages": messages, "tools": tools})).json()
    prefilled = engine.prepare(GenerateRequest(request_id="count", model="m", messages=messages,
                                               tools=msgspec.convert(tools, ToolSpec)))
    assert [span["id"] for span in offered] == prefilled.prompt_ids
    assert len(offered) > len(alone) + 20  # the tool prompt and the function's schema


async def test_detokenize_still_answers_off_the_loop(app, engine):
    ids = engine.tokenizer("Hello there").input_ids
    async with AsyncTestClient(app=app) as client:
        response = await client.post("/detokenize", json={"tokens": ids})
    assert response.json() == {"text": "Hello there"}


# ---- the worker secret ----


@pytest.fixture(scope="module")
def guarded(engine):
    return create_worker_app(engine, _info(engine), SECRET)


@pytest.mark.parametrize("headers", [{}, {WORKER_SECRET_HEADER: "wrong"}, {WORKER_SECRET_HEADER: ""},
                                     {"authorization": f"Bearer {SECRET}"}])
async def test_a_worker_with_a_secret_refuses_calls_without_it(guarded, headers):
    body = msgspec.json.encode(GenerateRequest(request_id="no-secret", model="smol", prompt="Hi"))
    async with AsyncTestClient(app=guarded) as client:
        answers = [await client.post("/generate", content=body, headers=headers),
                   await client.get("/load", headers=headers), await client.get("/info", headers=headers),
                   await client.post("/tokenize", json={"text": "hi"}, headers=headers),
                   await client.post("/detokenize", json={"tokens": [1]}, headers=headers)]
        health = await client.get("/health")
    for response in answers:
        assert response.status_code == 401
        assert response.json()["kind"] == "unauthorized"  # the worker's own Error shape
    assert health.status_code == 200  # bare liveness stays open for load balancers


async def test_the_right_secret_opens_every_route(guarded):
    headers = {WORKER_SECRET_HEADER: SECRET}
    async with AsyncTestClient(app=guarded) as client:
        assert (await client.get("/load", headers=headers)).json()["ready"] is True
        assert (await client.post("/tokenize", json={"text": "hi"}, headers=headers)).status_code == 200


async def _through_the_gateway(url: str) -> tuple[bool, list]:
    router = ReplicaRouter()
    router.add_replica("smol", url)
    try:
        pool = router.pool("smol")
        await pool.replicas[0].poll()
        if not pool.ready:
            return False, []
        request = GenerateRequest(request_id="gateway-call", model="smol", prompt="Hello",
                                  params=SamplingParams(max_tokens=3, temperature=0.0))
        return True, [event async for event in attempt(pool.replicas[0], msgspec.json.encode(request))]
    finally:
        await router.close()


async def test_the_gateways_own_calls_carry_the_secret(guarded, monkeypatch):
    monkeypatch.setenv(WORKER_SECRET_ENV, SECRET)  # as for remote workers: both sides read it
    with served(guarded) as url:
        ready, events = await _through_the_gateway(url)
    assert ready
    assert [type(e) for e in events].count(Token) == 3 and isinstance(events[-1], Done)


async def test_a_gateway_with_another_secret_keeps_the_worker_out_of_routing(guarded, monkeypatch):
    monkeypatch.setenv(WORKER_SECRET_ENV, "not-the-workers")
    with served(guarded) as url:
        ready, _ = await _through_the_gateway(url)
    assert not ready


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "worker.internal"])
def test_a_worker_bound_beyond_loopback_without_a_secret_exits_with_one_line(host):
    env = {k: v for k, v in os.environ.items() if k != WORKER_SECRET_ENV}
    done = subprocess.run([sys.executable, "-m", "worker", "--host", host, "--port", str(free_port())],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and WORKER_SECRET_ENV in lines[0] and host in lines[0]


async def test_local_workers_get_a_secret_and_none_of_the_gateways_secrets(tmp_path, monkeypatch):
    """The real spawn (local provisioner and standby workers): the worker's environment holds what it runs on and
    the generated secret, never the key pepper, the admin key or the database URL."""
    monkeypatch.delenv(WORKER_SECRET_ENV, raising=False)
    monkeypatch.setenv("SLUICE_KEY_PEPPER", "pepper-must-stay")
    monkeypatch.setenv("SLUICE_ADMIN_KEY", "admin-must-stay")
    monkeypatch.setenv("SLUICE_DATABASE_URL", "postgresql://user:password@db/sluice")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.setenv("SLUICE_MODEL_CACHE", str(MODEL_CACHE))
    native = {"CC": compiler(), "SLUICE_NATIVE_FLAGS": "-DSLUICE_ENVIRONMENT_TEST",  # q4's build, as configured
              "SLUICE_NATIVE_CACHE": str(tmp_path / "native")}
    for name, value in native.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(REPO)
    worker = await WorkerProcess.spawn(ModelConfig(), tmp_path, "environment-test")
    try:
        environ = dict(item.split("=", 1) for item in
                       Path(f"/proc/{worker.pid}/environ").read_text().split("\0") if "=" in item)
    finally:
        await worker.stop()
    assert not pid_alive(worker.pid)
    assert not {"SLUICE_KEY_PEPPER", "SLUICE_ADMIN_KEY", "SLUICE_DATABASE_URL"} & environ.keys()
    assert environ["AWS_REGION"] == "eu-west-1" and environ["SLUICE_MODEL_CACHE"] == str(MODEL_CACHE)
    assert environ["PATH"] == os.environ["PATH"] and environ["OMP_WAIT_POLICY"] == "PASSIVE"
    assert {name: environ.get(name) for name in native} == native
    secret = environ[WORKER_SECRET_ENV]
    assert len(secret) >= 32
    router = ReplicaRouter()  # the gateway's clients send that same secret
    try:
        assert router.add_replica("m", "http://127.0.0.1:1").worker.headers[WORKER_SECRET_HEADER] == secret
    finally:
        await router.close()
