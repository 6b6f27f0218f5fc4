"""Tenant <-> tenant through a LoRA adapter that cannot be loaded (issue 31, item 10): through `sluice serve`
and its real worker (a tiny random Llama with PEFT adapters written in the test).

A failing adapter is loaded once per backoff, not on every call; its caller gets 503 `adapter_unavailable`
with Retry-After and no word of the adapter's source (the log has it); the replica is not ejected, so other
teams' plain requests go on; and a load in progress is never on another request's path."""

from __future__ import annotations

import concurrent.futures
import os
import threading
from pathlib import Path

import httpx
import pytest
from transformers import LlamaForCausalLM

from testkit.lora_adapters import ATTENTION, write_adapter
from testkit.servers import free_port
from testkit.sluice import running_sluice
from testkit.tiny_model import write_tiny_model

pytestmark = pytest.mark.slow
MODEL = "tiny/llama"
BROKEN = "s3://adapters/gone"  # the S3 endpoint below is a closed port: every load fails as "unavailable"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapter-loads")
    tiny = write_tiny_model(root / "tiny")
    base = LlamaForCausalLM.from_pretrained(tiny)
    good = write_adapter(base, root / "good", 1, ATTENTION, rank=4, alpha=8)
    slow = write_adapter(base, root / "slow", 2, ATTENTION, rank=4, alpha=8)
    fresh = write_adapter(base, root / "fresh", 3, ATTENTION, rank=4, alpha=8)
    config = (f'[[models]]\nname = "{MODEL}"\nsource = "{tiny}"\nthreads = 1\ndecode_threads = 1\n'
              f'max_batch_size = 8\nmax_context = 256\n'
              f'adapters = {{ good = "{good}", slow = "{slow}", fresh = "{fresh}", broken = "{BROKEN}" }}\n')
    env = {"SLUICE_S3_ENDPOINT": f"http://127.0.0.1:{free_port()}", "AWS_ACCESS_KEY_ID": "test",
           "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1", "SLUICE_LOG_FORMAT": "json"}
    with running_sluice(root / "data", config=config, env=env) as running:
        yield running, slow


def complete(server, model: str) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/completions", headers={"authorization": f"Bearer {server.api_key}"},
                      json={"model": model, "prompt": "hello there", "max_tokens": 4, "temperature": 0}, timeout=120)


def test_a_failing_adapter_is_loaded_once_per_backoff_and_its_caller_learns_no_source(server):
    server, _ = server
    first = complete(server, f"{MODEL}:broken")
    assert first.status_code == 503, first.text
    assert first.json()["error"]["code"] == "adapter_unavailable"
    assert int(first.headers["retry-after"]) >= 1
    assert "s3://" not in first.text and "adapters/gone" not in first.text and "127.0.0.1" not in first.text
    # the replica was not ejected: another team's plain request is served at once, and so is the adapter's
    assert complete(server, MODEL).status_code == 200
    again = complete(server, f"{MODEL}:broken")
    assert again.status_code == 503 and again.json()["error"]["code"] == "adapter_unavailable"
    assert complete(server, f"{MODEL}:good").status_code == 200
    failed = [e for e in server.log_events_once("adapter_load_failed", bool) if e.get("adapter") == "broken"]
    assert len(failed) == 1 and failed[0]["source"] == BROKEN  # one load for both calls; the log names the source
    assert not server.log_events("replica_ejected")


def test_a_load_in_progress_holds_only_its_own_requests(server):
    """The slow adapter's config becomes a FIFO after the start-up check: its load blocks on reading it until the
    test writes it, as on a stalled disk or network. Meanwhile plain requests and other adapters' complete, the
    first request of an adapter never loaded before ("fresh") among them: its load does not queue behind."""
    server, slow = server
    config = Path(slow) / "adapter_config.json"
    text = config.read_text()
    config.unlink()
    os.mkfifo(config)
    released = threading.Event()
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(complete, server, f"{MODEL}:slow")
            for model in (MODEL, f"{MODEL}:good", f"{MODEL}:fresh", MODEL):
                assert complete(server, model).status_code == 200
                assert not waiting.done()  # still loading: it held up nobody
            released.set()
            config.write_text(text)  # the loader reads the config; the waiting request runs
            assert waiting.result(timeout=120).status_code == 200
    finally:
        if not released.is_set():  # unblock a loader thread that reads it, so the server can stop
            try:
                descriptor = os.open(config, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # no reader
                pass
            else:
                os.write(descriptor, text.encode())
                os.close(descriptor)
