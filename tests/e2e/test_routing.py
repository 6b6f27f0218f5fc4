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
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from tests.fixtures.servers import free_port
from tests.fixtures.sluice import MODEL_CACHE, running_sluice, standalone_worker_process

pytestmark = pytest.mark.slow
ADMIN_KEY = "routing-test-admin-key-0123456789abcdef"
WORKERS = ("w1", "w2", "w3")


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """A random two-layer Llama with SmolLM2's tokenizer, as a plain HF directory."""
    tokenizer = AutoTokenizer.from_pretrained(next(p for p in MODEL_CACHE.iterdir() if (p / "config.json").exists()))
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         eos_token_id=tokenizer.eos_token_id)
    directory = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


class StubReplica(BaseHTTPRequestHandler):
    """A replica that looks healthy and idle and fails every generation, as `server.mode` says."""

    def do_GET(self):
        bodies = {"/load": {"ready": True, "model": "stub", "queued": 0, "running_rows": 0, "max_rows": 16,
                            "free_cache_tokens": 100_000, "worker_id": "stub"},
                  "/info": {"model_id": "stub", "model_dtype": "float32", "device": "cpu", "quantization": "none",
                            "max_context": 4096, "max_rows": 16, "vocab_size": 49152, "eos_token_ids": [0],
                            "worker_id": "stub"},
                  "/health": {}}
        self._reply(200, bodies.get(self.path, {}))

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.server.attempts += 1
        if self.server.mode == "drop":  # as a crashed worker would: no answer at all
            self.close_connection = True
            self.connection.shutdown(2)
            return
        self._reply(429, {"type": "error", "kind": "overloaded", "message": "queue full"})

    def _reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def stub():
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), StubReplica)
    server.attempts, server.mode = 0, "drop"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def workers(tmp_path_factory, tiny_model_dir):
    model = {"source": str(tiny_model_dir), "threads": 1, "decode_threads": 1, "max_context": 4096}
    with contextlib.ExitStack() as stack:
        yield {name: stack.enter_context(standalone_worker_process(tmp_path_factory.mktemp(name), worker_id=name,
                                                                   **model))
               for name in WORKERS}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, workers, stub):
    urls = [url for url, _ in workers.values()]
    config = (f'[[models]]\nname = "tiny"\nurls = {json.dumps(urls)}\n'
              f'[[models]]\nname = "tiny-failover"\n'
              f'urls = {json.dumps([f"http://127.0.0.1:{stub.server_port}", urls[0]])}\n')
    with running_sluice(tmp_path_factory.mktemp("gateway"), config=config,
                        env={"SLUICE_ADMIN_KEY": ADMIN_KEY}) as server:
        yield server


def complete(gateway, model: str, count: int, max_tokens: int) -> list[httpx.Response]:
    async def all_at_once():
        async with httpx.AsyncClient(timeout=120) as client:
            return await asyncio.gather(*(client.post(f"{gateway.url}/v1/completions", headers=bearer(),
                                                      json={"model": model, "prompt": f"Request {i}",
                                                            "max_tokens": max_tokens, "min_tokens": max_tokens})
                                          for i in range(count)))

    return asyncio.run(all_at_once())


def bearer() -> dict:
    return {"authorization": f"Bearer {ADMIN_KEY}"}


def served_by(gateway, model: str, expected: int) -> list[str]:
    """The worker of every successful request of `model` so far, oldest first, once the ledger holds
    `expected` of them (records reach the database from the ledger's write-ahead log in batches)."""
    deadline = time.monotonic() + 60
    while True:
        records = httpx.get(f"{gateway.url}/admin/usage/records", headers=bearer(), timeout=30).json()["data"]
        found = [r["worker_id"] for r in sorted(records, key=lambda r: r["time"])
                 if r["model"] == model and r["status"] == "ok"]
        if len(found) >= expected or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def test_concurrent_requests_spread_over_the_least_loaded_replicas(gateway):
    replies = complete(gateway, "tiny", 6, max_tokens=300)
    assert [reply.status_code for reply in replies] == [200] * 6, [r.text for r in replies]
    spread = Counter(served_by(gateway, "tiny", 6))
    # each request is counted on its replica from the moment it is sent, so six overlapping requests
    # spread two by two; "first healthy replica" would have put all six on one
    assert set(spread) == set(WORKERS) and max(spread.values()) <= 3, spread


def test_a_replica_that_drops_the_connection_is_skipped_for_another(gateway, stub):
    stub.attempts, stub.mode = 0, "drop"
    replies = complete(gateway, "tiny-failover", 3, max_tokens=4)
    assert [reply.status_code for reply in replies] == [200] * 3, [r.text for r in replies]
    assert stub.attempts >= 1  # the idle-looking stub was tried first
    assert served_by(gateway, "tiny-failover", 3) == ["w1"] * 3


def test_an_overloaded_replica_is_skipped_for_another(gateway, stub):
    stub.attempts, stub.mode = 0, "overloaded"
    before = len(served_by(gateway, "tiny-failover", 3))
    sent = 0
    # one at a time, so the stub is the least loaded every time once it is back from the ejection that the
    # dropped connections of the test before earned it (an overloaded answer ejects nobody)
    deadline = time.monotonic() + 120
    while stub.attempts < 3 and time.monotonic() < deadline:
        reply = complete(gateway, "tiny-failover", 1, max_tokens=4)[0]
        assert reply.status_code == 200, reply.text
        sent += 1
        if stub.attempts == 0:
            time.sleep(0.5)
    assert stub.attempts >= 3
    assert served_by(gateway, "tiny-failover", before + sent)[before:] == ["w1"] * sent


def test_a_killed_worker_is_routed_around(gateway, workers):
    _, process = workers["w3"]
    process.kill()
    process.wait(timeout=20)
    before = len(served_by(gateway, "tiny", 6))
    replies = complete(gateway, "tiny", 6, max_tokens=4)  # at once: the gateway may not have polled yet
    assert [reply.status_code for reply in replies] == [200] * 6, [r.text for r in replies]
    after = served_by(gateway, "tiny", before + 6)[before:]
    assert len(after) == 6 and set(after) <= {"w1", "w2"}, after
    assert httpx.get(f"{gateway.url}/health", timeout=10).status_code == 200  # the model still has replicas
