"""The scheduler's plans (worker/engine/scheduler.py): real requests prepared by an Engine on a tiny random Llama,
planned step by step with the engine thread never started, and executed where a plan depends on the last."""

from __future__ import annotations

import time

import pytest
import torch

from common.protocol import Accepted, Error, ModelConfig
from tests.worker.beam.tiny import tiny_model
from tests.worker.engine.runs import request, submit
from worker.engine.engine import Engine
from worker.engine.outputs import StepEvents
from worker.engine.scheduler import Prefill
from worker.engine.sequence import RequestState

PROMPT = [1, 2, 3, 4, 5, 6, 7, 2, 3, 4]  # ten tokens: nine are prefilled, the tenth feeds the first decode step


@pytest.fixture
def engine(tmp_path):
    config = ModelConfig(name="tiny", max_batch_size=6, max_context=64, max_batched_tokens=64, decode_threads=1)
    return Engine(tiny_model(), config, "plans", tmp_path, compile_later=True)


def waiting(engine: Engine, tenant: str, **params) -> tuple[RequestState, list]:
    """A request as the engine thread takes it from the inbox, with the events its sink got."""
    events: list = []
    params = {"prompt_ids": PROMPT, "max_tokens": 8, "temperature": 0.0, "ignore_eos": True, "tenant": tenant} | params
    state = RequestState(engine.prepare(request(**params)), events.extend)
    engine.scheduler.reserve_place()
    engine.scheduler.add(state)
    return state, events


def run(engine: Engine, plan) -> None:
    with torch.inference_mode():
        events = StepEvents()
        report = engine.executor.run(plan, events)
        events.deliver()
        engine.scheduler.finish(plan, report)


def test_tenants_take_turns_at_the_free_rows_and_the_rest_wait(engine):
    first_a, _ = waiting(engine, "a")
    second_a, _ = waiting(engine, "a")
    pair_b, _ = waiting(engine, "b", n=2)
    beams_c, _ = waiting(engine, "c", num_beams=3, max_tokens=3)
    plan = engine.scheduler.schedule()
    # a, b and c each start one request (6 rows: the batch is full); a's second waits though it came before b's
    assert plan.prefills == [Prefill(first_a, 0, 9, True), Prefill(pair_b, 0, 9, True), Prefill(beams_c, 0, 9, True)]
    assert list(engine.scheduler.waiting) == [second_a] and engine.scheduler.queued == 1
    assert plan.dropped == []
    # ordinary and beam rows both start: the first mixed step measures the ordinary rows alone
    assert plan.beams_sit_out
    run(engine, plan)
    assert [(row.request, row.candidate) for row in engine.rows] == [
        (first_a, 0), (pair_b, 0), (pair_b, 1), (beams_c, 0), (beams_c, 1), (beams_c, 2)]
    assert [row.length for row in engine.rows] == [10, 10, 10, 9, 9, 9]  # the beam rows sat out
    # the batch is full: nothing is prefilled; this time the beam rows decode too
    plan = engine.scheduler.schedule()
    assert plan.prefills == [] and not plan.beams_sit_out


def test_a_long_prompt_is_prefilled_in_chunks_while_the_running_rows_decode(tmp_path):
    config = ModelConfig(name="tiny", max_batch_size=4, max_context=64, max_batched_tokens=4, decode_threads=1)
    engine = Engine(tiny_model(), config, "chunks", tmp_path, compile_later=True)
    short, _ = waiting(engine, "a", prompt_ids=[1, 2, 3])
    long, long_events = waiting(engine, "b")
    plan = engine.scheduler.schedule()
    # the short prompt's two positions, then two of the long one's nine: four tokens in all
    assert plan.prefills == [Prefill(short, 0, 2, True), Prefill(long, 0, 2, False)]
    run(engine, plan)
    assert [row.request for row in engine.rows] == [short] and engine.scheduler.prefilling is long
    assert long.prefilled == 2 and long_events == []
    plans = []
    while engine.scheduler.prefilling is long:
        plans.append(engine.scheduler.schedule())
        run(engine, plans[-1])
    assert [plan.prefills for plan in plans] == [[Prefill(long, 2, 4, False)], [Prefill(long, 6, 3, True)]]
    assert [row.request for row in engine.rows] == [short, long] and isinstance(long_events[0], Accepted)
    assert len(engine.rows[0].output_ids) == 3  # the short request decoded at every step meanwhile


def test_a_request_past_its_deadline_is_dropped_and_the_next_one_starts(engine):
    late, late_events = waiting(engine, "a", deadline_unix=time.time() - 1)
    on_time, _ = waiting(engine, "b")
    plan = engine.scheduler.schedule()
    assert [(state, error.kind) for state, error in plan.dropped] == [(late, "timeout")]
    assert plan.prefills == [Prefill(on_time, 0, 9, True)]
    assert late.done and late.request_id not in engine.by_id and engine.scheduler.queued == 0
    run(engine, plan)
    assert [type(event) for event in late_events] == [Error]


def test_a_request_waits_until_its_candidates_fit_and_is_never_overtaken(engine):
    wide, _ = waiting(engine, "a", n=4)
    wider, _ = waiting(engine, "b", n=3)
    behind, _ = waiting(engine, "c")
    plan = engine.scheduler.schedule()
    assert plan.prefills == [Prefill(wide, 0, 9, True)]  # 4 rows run; b's 3 do not fit and c waits behind b
    assert list(engine.scheduler.waiting) == [wider, behind]


@pytest.mark.parametrize("params", [{"temperature": 0.0},
                                    {"temperature": 1.0, "seed": [4], "repetition_penalty": 1.2, "ignore_eos": True}])
def test_a_chunked_prompt_gives_what_the_whole_prompt_gives(tmp_path, params):
    """Prefilled three tokens a step beside a running request, or whole: the same prompt logprobs and tokens
    (and, greedy, transformers generate()'s)."""
    prompt = [1, *([2, 3, 5, 6, 7, 4] * 5)]
    outputs = []
    for budget in (3, 64):
        config = ModelConfig(name="tiny", max_batch_size=2, max_context=64, max_batched_tokens=budget,
                             decode_threads=1)
        engine = Engine(tiny_model(), config, "chunks", tmp_path, compile_later=True)
        engine.start()
        try:
            beside = submit(engine, request(prompt_ids=[1, 2], max_tokens=40, ignore_eos=True, temperature=0.0))
            run = submit(engine, request(prompt_ids=prompt, max_tokens=10, prompt_logprobs=True, **params),
                         strict=True).wait()
            beside.wait()
        finally:
            engine.stop()
        outputs.append((run.finishes[0].token_ids, [t.logprob or 0.0 for t in run.accepted.prompt_details]))
    (chunked, chunked_logprobs), (whole, whole_logprobs) = outputs
    assert chunked == whole
    assert chunked_logprobs == pytest.approx(whole_logprobs, abs=1e-5) and len(whole_logprobs) == len(prompt)
    if params["temperature"] == 0.0:
        model = tiny_model().model
        expected = model.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False)[0, len(prompt):]
        assert whole == expected.tolist()
