"""A worker that wakes for a burst: what its start leaves measured and built, and how the burst's first steps
admit it. Real Engines on tiny random Llamas (the word-level tokenizer of tests/worker/beam/tiny.py), stepped
by hand where the plan matters, with a PrefillPace fed a machine's timings (the tiny model's own timings say
nothing)."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from common.protocol import ModelConfig
from tests.worker.beam.tiny import tiny_model
from tests.worker.engine.runs import request, submit
from worker.engine.engine import Engine
from worker.engine.native.build import NativeUnavailable, compiler
from worker.engine.outputs import StepEvents
from worker.engine.prefill_pace import PrefillPace
from worker.loading import LoadedModel

SHORT = [1, 2, 3, 4, 5, 6, 7, 2, 3]  # a burst's short prompt: 8 tokens prefilled


def short_prompts_machine() -> PrefillPace:
    """A pace that has measured only 8-token forwards (10 ms each) and decode steps of 40 ms: what a worker
    knows after its warm-up and a burst's first prompt."""
    pace = PrefillPace(512)
    for _ in range(3):
        pace.record_prefill(8, 0.01)
    pace.record_decode(0.04)
    return pace


def engine_of(tmp_path, rows: int, loaded: LoadedModel | None = None, **config) -> Engine:
    config = ModelConfig(name="tiny", max_batch_size=rows, max_context=64, decode_threads=1, **config)
    return Engine(loaded or tiny_model(), config, "wake", tmp_path, compile_later=True)


def step_with(engine: Engine, pace: PrefillPace):
    """One engine step with `pace`; its plan."""
    with torch.inference_mode():
        engine._take_inbox(block=False)
        engine.scheduler.pace = pace
        plan = engine.scheduler.schedule()
        events = StepEvents()
        report = engine.executor.run(plan, events)
        events.deliver()
        engine.scheduler.finish(plan, report)
    return plan


def test_each_forward_is_bounded_by_what_was_measured_not_the_steps_whole_prefill():
    allowance = short_prompts_machine().allowance(decoding=True, prompts=6)  # 0.7 x 40 ms x 6 = 168 ms
    assert [allowance.grant(8) for _ in range(6)] == [8] * 6  # six 8-token prompts at 10 ms each
    assert allowance.open
    longer = short_prompts_machine().allowance(decoding=True, prompts=6)
    assert longer.grant(60) == 16  # one forward: at most twice the largest measured, and the step's prefill ends
    assert not longer.open


def test_a_burst_that_reached_the_worker_after_its_first_step_joins_in_the_next_one(tmp_path):
    """The first prompt of a burst runs alone (the engine woke for it); the rest arrive while it runs and join
    together in the next step beside its row, not two a step behind one another."""
    engine = engine_of(tmp_path, rows=8)
    first = submit(engine, request(prompt_ids=SHORT, max_tokens=20, ignore_eos=True, temperature=0.0))
    assert [p.count for p in step_with(engine, short_prompts_machine()).prefills] == [8]
    rest = [submit(engine, request(prompt_ids=SHORT, max_tokens=4, ignore_eos=True, temperature=0.0))
            for _ in range(6)]
    plan = step_with(engine, short_prompts_machine())
    assert [p.count for p in plan.prefills] == [8] * 6
    assert len(engine.slots.rows) == 7 and len(first.tokens()) == 2 and all(len(run.tokens()) == 1 for run in rest)


def test_the_cache_makes_room_for_every_waiting_row_at_once(tmp_path):
    """Rows of a burst join over several steps; the KV cache's slot axis grows once for all of them (up to
    max_batch_size), not four slots at a time as they arrive."""
    engine = engine_of(tmp_path, rows=16)
    for _ in range(11):
        submit(engine, request(prompt_ids=SHORT, max_tokens=8, ignore_eos=True, temperature=0.0))
    plan = step_with(engine, PrefillPace(512))  # nothing decodes yet: every prompt starts
    assert len(plan.prefills) == 11 and plan.rows_ahead == 11
    assert engine.runner.cache.rows == 12  # in steps of kv_cache.ROW_STEP
    for _ in range(9):
        submit(engine, request(prompt_ids=SHORT, max_tokens=8, ignore_eos=True, temperature=0.0))
    grown = engine.runner.cache.keys[0]
    plan = step_with(engine, PrefillPace(512))  # nothing measured: beside decoding rows, MIN_CHUNK tokens a step
    assert len(plan.prefills) == 1 and plan.rows_ahead == 16  # one joins; of the other 8, 4 fit in max_batch_size
    assert engine.runner.cache.rows == 16 and engine.runner.cache.keys[0] is not grown
    grown = engine.runner.cache.keys[0]
    plan = step_with(engine, PrefillPace(512))
    assert len(plan.prefills) == 1 and len(engine.slots.rows) == 13
    assert engine.runner.cache.keys[0] is grown  # room was made: the row joining now grows nothing


def test_the_warm_up_leaves_the_prefill_pace_measured(tmp_path):
    """A woken worker has measured a prompt's forward and a decode step before its first request: a burst's
    prompts are admitted by the pace from the first step that decodes, not MIN_CHUNK tokens a step."""
    engine = engine_of(tmp_path, rows=4)
    engine.start()
    try:
        engine.warm_up()
        assert engine.scheduler.pace.cost() is not None and engine.scheduler.pace.decode_s is not None
        assert engine.scheduler.pace.largest >= 4
    finally:
        engine.stop()


def _q4_tiny() -> LoadedModel:
    """A random Llama the native forward runs (projections in groups of 32), with the tiny word tokenizer."""
    words = tiny_model()
    torch.manual_seed(5)
    config = LlamaConfig(vocab_size=words.model.config.vocab_size, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=64, bos_token_id=1, eos_token_id=0, pad_token_id=0,
                         tie_word_embeddings=False)
    return dataclasses.replace(words, model=LlamaForCausalLM(config).eval(), quantization="q4")


def test_under_the_native_forward_the_scripted_layers_wait_for_the_first_quiet_moment(tmp_path):
    """q4 decodes rows without an adapter natively: its start does not compile the scripted layers (only
    adapter rows use them); the engine builds them once quiet, and serves meanwhile."""
    try:
        compiler()
    except NativeUnavailable:
        pytest.skip("no C compiler: no native forward")
    engine = engine_of(tmp_path, rows=4, loaded=_q4_tiny(), quantization="q4")
    assert engine.runner.native is not None
    engine.start()
    try:
        engine.warm_up()
        engine.finish_start()
        assert engine.runner._decode_layers is None  # the Python path until built: same logits
        served = submit(engine, request(prompt_ids=SHORT, max_tokens=3, ignore_eos=True, temperature=0.0)).wait()
        assert len(served.finishes[0].token_ids) == 3
        deadline = time.monotonic() + 120
        while engine.quiet_work.pending and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not engine.quiet_work.pending
        assert isinstance(engine.runner._decode_layers, torch.jit.ScriptModule)
    finally:
        engine.stop()


def test_without_the_native_forward_the_scripted_layers_are_built_before_traffic(tmp_path):
    engine = engine_of(tmp_path, rows=4)
    engine.start()
    try:
        engine.warm_up()
        engine.finish_start()
        assert isinstance(engine.runner._decode_layers, torch.jit.ScriptModule)
    finally:
        engine.stop()
