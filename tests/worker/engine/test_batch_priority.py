"""Batch priority (GenerateRequest.priority, worker/engine/README.md "Batch priority"): batch rows fill idle rows
and give them up to an interactive request at once, then resume exactly. Real Engines on a tiny random Llama,
stepped by hand, so the wait is counted in engine steps."""

from __future__ import annotations

import msgspec
import pytest
import torch

from common.protocol import GenerateRequest
from tests.worker.beam.tiny import tiny_model
from tests.worker.engine.runs import request, submit
from tests.worker.engine.test_preemption import PROMPTS, engine_of, step, steps_until_done
from worker.engine.engine import Engine
from worker.engine.prepare_errors import RequestRejected


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=5, sharpness=1.0)


def ask(engine, prompt: list[int], tokens: int, tenant: str, priority: str = "interactive"):
    return submit(engine, request(prompt_ids=prompt, max_tokens=tokens, ignore_eos=True, temperature=0.0,
                                  tenant=tenant, priority=priority), strict=True)


def greedy(model, prompt: list[int], length: int) -> list[int]:
    return model.model.generate(torch.tensor([prompt]), max_new_tokens=length, min_new_tokens=length,
                                do_sample=False)[0, len(prompt):].tolist()


def test_an_interactive_request_takes_a_batch_row_at_once_and_the_batch_resumes_exactly(model, tmp_path):
    engine = engine_of(model, tmp_path, rows=2)
    # the same tenant: fair turns alone would keep it waiting (its tenant runs rows); its priority does not
    batch = [ask(engine, prompt, 12, "t", "batch") for prompt in PROMPTS[:2]]
    step(engine, 3)
    assert len(engine.rows) == 2 and all(len(run.tokens()) > 0 for run in batch)
    interactive = ask(engine, PROMPTS[2], 2, "t")
    step(engine, 1)
    assert len(interactive.tokens()) == 1  # its first token in the first step after it arrived
    assert engine.scheduler.preemptions == 1
    parked = engine.scheduler.waiting[0]
    assert parked.request_id == batch[1].request_id and parked.parked
    steps_until_done(engine, [interactive])
    assert engine.scheduler.preemptions == 1  # a parked batch row never takes a row back from it
    steps_until_done(engine, batch)
    for run, prompt in zip([*batch, interactive], PROMPTS):
        expected = greedy(model, prompt, len(run.finishes[0].token_ids))
        assert run.finishes[0].token_ids == expected, (run.request_id, prompt)
        assert [t.token_id for t in run.tokens()] == expected  # streamed once each, none repeated or lost


def test_a_waiting_batch_request_starts_only_when_no_interactive_one_waits(model, tmp_path):
    engine = engine_of(model, tmp_path, rows=1)
    first = ask(engine, PROMPTS[0], 3, "a")
    step(engine, 1)
    waiting_batch = ask(engine, PROMPTS[1], 3, "b", "batch")
    later = ask(engine, PROMPTS[2], 3, "a")
    steps_until_done(engine, [first])
    step(engine, 1)
    # the interactive request that came later took the freed row; the batch one still waits, never preempting
    assert [row.request.request_id for row in engine.rows] == [later.request_id]
    assert not waiting_batch.tokens() and engine.scheduler.preemptions == 0
    steps_until_done(engine, [later, waiting_batch])
    assert waiting_batch.finishes[0].token_ids == greedy(model, PROMPTS[1], 3)


def test_a_bad_priority_is_refused(model, tmp_path):
    engine = engine_of(model, tmp_path, rows=1)
    with pytest.raises(RequestRejected) as refused:
        engine.prepare(request(prompt_ids=PROMPTS[0], max_tokens=2, priority="urgent"))
    assert refused.value.field == "priority" and "interactive, batch" in refused.value.message
    with pytest.raises(msgspec.ValidationError, match="priority"):  # the worker's /generate decoder
        msgspec.json.Decoder(GenerateRequest).decode(b'{"request_id": "r", "model": "m", "priority": "urgent"}')


def test_a_batch_prompt_half_prefilled_steps_aside_for_an_interactive_one(model, tmp_path):
    from common.protocol import ModelConfig

    config = ModelConfig(name="tiny", max_batch_size=2, max_context=64, decode_threads=1, max_batched_tokens=4)
    engine = Engine(model, config, "priority", tmp_path, compile_later=True)
    long_prompt = [1, 2, 3, 4, 5, 6, 7, 2, 3, 4, 5, 6, 7, 2, 3, 4, 5, 6, 7, 2]
    batch = ask(engine, long_prompt, 4, "t", "batch")
    step(engine, 1)  # 4 of its 19 prompt positions in the cache
    assert engine.scheduler.prefilling is not None and engine.scheduler.prefilling.request_id == batch.request_id
    interactive = ask(engine, PROMPTS[2], 2, "t")
    step(engine, 1)
    assert len(interactive.tokens()) == 1 and not batch.tokens()  # its prompt took the step, the batch's waited
    steps_until_done(engine, [interactive, batch])
    assert batch.finishes[0].token_ids == greedy(model, long_prompt, 4)  # it went on where it stopped
    assert interactive.finishes[0].token_ids == greedy(model, PROMPTS[2], 2)
