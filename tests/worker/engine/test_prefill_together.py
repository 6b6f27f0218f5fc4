"""Prompts admitted in one step share a native forward (executor.py `_prefill_together`): each chunk is staged in
the slot its request takes once the ones before it have joined, so the weights are read once for all of them.
The native forward is batch-invariant, so every request must get bitwise what it gets prefilled alone."""

from __future__ import annotations

import copy
import dataclasses

import pytest
from structlog.testing import capture_logs

from common.protocol import ModelConfig, Token
from testkit.tiny_model import tiny_llama
from tests.worker.beam.helpers import Collector, request
from worker.engine.engine import Engine

SHARED = "The ferry crossed the river at dawn while the mill turned and the market opened its stalls. " * 3


@pytest.fixture(scope="module")
def q4_model(smol_cpu):
    return tiny_llama(smol_cpu.tokenizer, seed=4)


def _engine(loaded) -> Engine:
    picked = dataclasses.replace(loaded, model=copy.deepcopy(loaded.model), quantization="q4")
    engine = Engine(picked, ModelConfig(max_batch_size=8, max_context=256), "together")
    assert engine.runner.native is not None
    return engine


def _served(engine: Engine, requests: list, started: bool) -> list[Collector]:
    """Submit every request, then start the engine if it is not running (its first step then plans them all)."""
    sinks = [Collector() for _ in requests]
    for generate, sink in zip(requests, sinks):
        engine.submit(engine.prepare(generate), sink)
    if not started:
        engine.start()
    for sink in sinks:
        assert sink.finished.wait(300), "the engine did not answer in time"
    return sinks


def _outcome(sink: Collector) -> tuple:
    tokens = [(t.token_id, t.logprob, t.top_logprobs) for t in sink.events if isinstance(t, Token)]
    return tokens, [(f.index, f.token_ids, f.reason) for f in sink.finishes]


def _each_alone(loaded, requests: list) -> list[tuple]:
    """Each request's outcome served on its own, one after another, on an engine of its own."""
    engine = _engine(loaded)
    engine.start()
    try:
        return [_outcome(_served(engine, [generate], started=True)[0]) for generate in requests]
    finally:
        engine.stop()


def test_a_burst_prefilled_together_gets_what_each_prompt_gets_alone(q4_model, monkeypatch):
    """The first burst, submitted before the engine starts, is planned in one step: its chunks share forwards
    (a prompt with two candidates runs its own). A second burst, sent while the engine runs, reuses the
    first's cached prefix. Each request's tokens and logprobs equal those it gets alone."""
    tokenizer = q4_model.tokenizer
    first = [SHARED + "Then the", "Short one.", "A prompt of middling length, here.", "Two candidates follow.",
             "Last of the burst"]
    second = [SHARED + "After that, a long", SHARED + "Later", "Something else entirely"]
    settings = {"Two candidates follow.": dict(temperature=0.9, seed=[3], n=2)}

    def burst(prompts: list[str]) -> list:
        return [request(tokenizer(p).input_ids, max_tokens=6, min_tokens=6,
                        **settings.get(p, dict(temperature=0.0, logprobs=2))) for p in prompts]

    expected = _each_alone(q4_model, burst(first + second))

    together = _engine(q4_model)
    shared_forwards: list[int] = []  # chunks per shared forward: counted, then run as they are
    run = together.runner.prefill_together
    monkeypatch.setattr(together.runner, "prefill_together",
                        lambda chunks, threads=None: (shared_forwards.append(len(chunks)), run(chunks, threads))[1])
    try:
        sinks = _served(together, burst(first), started=False)
        assert shared_forwards == [3]  # the two-candidate prompt ran alone, and so did the last after it
        sinks += _served(together, burst(second), started=True)
    finally:
        together.stop()
    assert [_outcome(sink) for sink in sinks] == expected
    assert all(sink.done.cached_tokens > 0 for sink in sinks[len(first):len(first) + 2])


def test_a_shared_forward_that_raises_is_run_again_one_prompt_at_a_time(q4_model, monkeypatch):
    """Which prompt a failed shared forward belongs to is unknown: the executor logs it and prefills each
    prompt on its own (where a failure is that request's alone), so the burst is served as before."""
    tokenizer = q4_model.tokenizer
    prompts = ["One prompt.", "Another prompt, longer than the first.", "A third"]

    def burst() -> list:
        return [request(tokenizer(p).input_ids, max_tokens=4, min_tokens=4, temperature=0.0) for p in prompts]

    expected = _each_alone(q4_model, burst())
    engine = _engine(q4_model)

    def fails(chunks, threads=None):
        raise MemoryError("the native forward could not allocate its scratch memory")

    monkeypatch.setattr(engine.runner, "prefill_together", fails)
    try:
        with capture_logs() as logs:
            got = [_outcome(sink) for sink in _served(engine, burst(), started=False)]
    finally:
        engine.stop()
    assert got == expected
    assert [entry["event"] for entry in logs].count("prefill_together_failed") == 1
