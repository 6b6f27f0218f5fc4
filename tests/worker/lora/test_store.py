"""The adapter LRU inside a running engine: eviction with more adapters than slots, adapters in use
kept, a cold load beside running rows, failed loads answered cleanly, and S3 sources."""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time

import boto3
import pytest

from common.protocol import Accepted, AdapterRef, Done, Error, ModelConfig
from testkit.lora_adapters import write_adapter
from testkit.servers import free_port
from tests.worker.engine.runs import Run, request, running_engine
from tests.worker.lora.adapters import references
from worker.engine.engine import Engine

PROMPT = "The capital of France is"


class Tracked(Run):
    """A Run that also records, at each of its events, the engine step and what the store holds."""

    def __init__(self, engine, generate, problems: list):
        super().__init__(generate.request_id)
        self.engine, self.problems, self.steps = engine, problems, {}

    def sink(self, batch: list) -> None:  # on the engine thread, between steps
        engine = self.engine
        loaded = set(engine.adapters.loaded_names)
        in_use = {row.request.adapter.name for row in engine.rows if row.request.adapter is not None}
        if not in_use <= loaded or len(loaded) > engine.adapters.capacity:
            self.problems.append((sorted(in_use), sorted(loaded)))
        for event in batch:
            self.steps.setdefault(type(event), engine.steps)
        super().sink(batch)


def start(engine, directory=None, problems=None, tokens: int = 12, name: str | None = None) -> Tracked:
    generate = request(PROMPT, max_tokens=tokens, temperature=0)
    if directory is not None:
        generate.adapter = AdapterRef(name=name or directory.name, source=str(directory))
    run = Tracked(engine, generate, [] if problems is None else problems)
    engine.submit(engine.prepare(generate), run.sink)
    return run


def expected_tokens(tiny, directory, tokens: int = 12) -> list[int]:
    ids = tiny.tokenizer(PROMPT).input_ids
    return references(tiny.model, directory, [ids], tokens, tiny.tokenizer.eos_token_id)[0]


def test_more_adapters_than_slots_are_evicted_least_recently_used_first(tiny, tiny_adapters):
    problems: list = []
    with running_engine(tiny, "lru", max_batch_size=16, max_context=256, max_loaded_adapters=2) as engine:
        order = ["attention", "mlp", "every", "qv", "attention", "mlp"]
        runs = [start(engine, tiny_adapters[name], problems) for name in order for _ in range(2)]
        for run in runs:
            run.wait()
        for index, run in enumerate(runs):
            assert not run.of(Error), run.of(Error)
            assert run.finishes[0].token_ids == expected_tokens(tiny, tiny_adapters[order[index // 2]])
        assert not problems  # never more than two held, and never one a running row needs
        assert sorted(engine.load().adapters) == ["attention", "mlp"]  # the two used last


def test_a_request_waits_for_a_slot_while_the_queue_behind_it_moves_on(tiny, tiny_adapters):
    problems: list = []
    with running_engine(tiny, "lru-one", max_batch_size=16, max_context=256, max_loaded_adapters=1) as engine:
        first = start(engine, tiny_adapters["every"], problems, tokens=30)
        second = start(engine, tiny_adapters["qv"], problems, tokens=8)
        base = start(engine, problems=problems, tokens=8)
        for run in (first, second, base):
            run.wait()
        # "qv" needs the only slot, which "every" holds until its rows finish; the base request behind it starts
        assert second.steps[Accepted] >= first.steps[Done]
        assert base.steps[Done] < first.steps[Done]
        assert second.finishes[0].token_ids == expected_tokens(tiny, tiny_adapters["qv"], 8)
        assert not problems


def test_a_cold_load_does_not_stall_running_rows(tiny, tiny_adapters, tmp_path):
    """The adapter's config is a FIFO: its load blocks on reading it until the test writes it, as on a
    slow disk or network. Meanwhile the running request decodes to its end and later ones start."""
    cold = tmp_path / "cold"
    shutil.copytree(tiny_adapters["every"], cold)
    text = (cold / "adapter_config.json").read_text()
    (cold / "adapter_config.json").unlink()
    os.mkfifo(cold / "adapter_config.json")
    writer = threading.Thread(target=(cold / "adapter_config.json").write_text, args=(text,), daemon=True)
    with running_engine(tiny, "cold", max_batch_size=16, max_context=256) as engine:
        try:
            running = start(engine, tokens=40)
            waiting = start(engine, cold)
            later = start(engine, tokens=8)
            running.wait()
            later.wait()
            assert waiting.events == []  # still in the queue, its adapter loading
            assert len(running.finishes[0].token_ids) == 40 and running.steps[Accepted] < running.steps[Done]
        finally:
            writer.start()  # the loader reads the config; the waiting request starts
        waiting.wait()
        assert waiting.finishes[0].token_ids == expected_tokens(tiny, tiny_adapters["every"])


def test_bad_adapters_get_a_clean_error_and_the_worker_keeps_serving(tiny, tiny_adapters, tmp_path):
    dora = write_adapter(tiny.model, tmp_path / "dora", 9, ["q_proj", "v_proj"], rank=4, use_dora=True)
    missing = tmp_path / "later"
    with running_engine(tiny, "bad", max_batch_size=16, max_context=256, adapter_retry_s=0) as engine:
        lost = [start(engine, missing) for _ in range(3)]  # all waiting for the same failed load
        broken = start(engine, dora)
        fine = start(engine, tiny_adapters["qv"])
        for run in lost + [broken, fine]:
            run.wait()
        for run in lost:
            (error,) = run.events
            assert (error.kind, error.field) == ("not_found", "adapter") and "does not exist" in error.message
        (error,) = broken.events
        assert (error.kind, error.field) == ("validation", "adapter") and "DoRA" in error.message
        assert fine.finishes[0].token_ids == expected_tokens(tiny, tiny_adapters["qv"])
        # no backoff (adapter_retry_s = 0): once the files are there, the next request loads them
        shutil.copytree(tiny_adapters["mlp"], missing)
        assert start(engine, missing).wait().finishes[0].token_ids == expected_tokens(tiny, tiny_adapters["mlp"])
        assert engine.load().ready and engine.load().queued == 0


def test_a_failed_load_is_remembered_for_its_backoff(tiny, tiny_adapters, tmp_path):
    """Requests during the backoff get the failure at once, with how long it still runs; fixing the files does
    not start a load before it ends."""
    missing = tmp_path / "later"
    with running_engine(tiny, "backoff", max_batch_size=16, max_context=256, adapter_retry_s=3600) as engine:
        (first,) = start(engine, missing).wait().events
        assert first.field == "adapter" and 3500 < first.retry_after_s <= 3600
        shutil.copytree(tiny_adapters["mlp"], missing)
        (again,) = start(engine, missing).wait().events  # cached: the files are not read again
        assert (again.kind, again.field) == ("not_found", "adapter") and 0 < again.retry_after_s <= first.retry_after_s
        assert engine.load().adapters == []
        assert start(engine).wait().finishes  # the base model is served meanwhile


def test_the_backoff_doubles_while_loads_keep_failing(tiny, tmp_path):
    missing = tmp_path / "never"
    with running_engine(tiny, "doubling", max_batch_size=16, max_context=256, adapter_retry_s=0.2) as engine:
        (first,) = start(engine, missing).wait().events
        time.sleep(0.3)  # past the first backoff: the next request loads again, and fails again
        (second,) = start(engine, missing).wait().events
        assert first.retry_after_s == pytest.approx(0.2) and second.retry_after_s == pytest.approx(0.4)


@contextlib.contextmanager
def engine_on(loaded, data_dir, **config):
    """A started engine that downloads into `data_dir`."""
    engine = Engine(loaded, ModelConfig(**config), "s3-worker", data_dir=data_dir)
    engine.start()
    try:
        yield engine
    finally:
        engine.stop()


@pytest.fixture
def s3(monkeypatch):
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    for name, value in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                        "AWS_DEFAULT_REGION": "us-east-1", "SLUICE_S3_ENDPOINT": endpoint}.items():
        monkeypatch.setenv(name, value)
    try:
        yield boto3.client("s3", endpoint_url=endpoint)
    finally:
        server.stop()


def test_s3_sources_download_once_into_the_data_dir(tiny, tiny_adapters, tmp_path, s3):
    s3.create_bucket(Bucket="adapters")
    for item in tiny_adapters["attention"].iterdir():
        s3.upload_file(str(item), "adapters", f"team/attention/{item.name}")
    data_dir = tmp_path / "data"
    with engine_on(tiny, data_dir, max_batch_size=16, max_context=256, max_loaded_adapters=1) as engine:
        def generate(source: str) -> Run:
            generate = request(PROMPT, max_tokens=12, temperature=0)
            generate.adapter = AdapterRef(name="from-s3", source=source)
            run = Run(generate.request_id)
            engine.submit(engine.prepare(generate), run.sink)
            return run.wait()

        expected = expected_tokens(tiny, tiny_adapters["attention"])
        assert generate("s3://adapters/team/attention").finishes[0].token_ids == expected
        assert (data_dir / "s3" / "adapters" / "team" / "attention" / "adapter_config.json").is_file()
        start(engine, tiny_adapters["qv"]).wait()  # evicts the S3 adapter (one slot)
        s3.delete_object(Bucket="adapters", Key="team/attention/adapter_model.safetensors")
        assert generate("s3://adapters/team/attention").finishes[0].token_ids == expected  # from the data dir
        for source, kind in [("s3://adapters/team/nothing-here", "not_found"), ("s3://no-such-bucket/x", "not_found"),
                             ("s3://adapters", "validation")]:
            (error,) = generate(source).events
            assert (error.kind, error.field) == (kind, "adapter"), (source, error)
