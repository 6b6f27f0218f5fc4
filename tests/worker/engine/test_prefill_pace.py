"""The prefill pace (worker/engine/prefill_pace.py) and the scheduling rules it sets, in engine steps: while rows
decode, a step prefills about what one decode step costs on the machine measured; with nothing decoding, the
whole `max_batched_tokens`; a tenant running nothing has its prompt in the next step with no other prompt
after it, and one that arrives while a step runs its prefills has it next in that step. Real Engines on a tiny
random Llama, stepped by hand; the machine is a PrefillPace fed the timings of a CPU-like or a GPU-like machine
before each step (the tiny model's own timings say nothing)."""

from __future__ import annotations

import pytest
import torch

from common.protocol import Accepted, ModelConfig
from tests.worker.beam.tiny import tiny_model
from tests.worker.engine.runs import Run, request, submit
from worker.engine.engine import Engine
from worker.engine.outputs import StepEvents
from worker.engine.prefill_pace import MIN_CHUNK, PACE, PrefillPace
from worker.engine.scheduler import Prefill

LONG = [1, *([2, 3, 5, 6, 7, 4] * 10)]  # 61 tokens: 60 are prefilled


def machine(overhead: float, per_token: float, decode_s: float, byte_s: float | None = None) -> PrefillPace:
    """A pace that has measured forwards of `overhead + per_token x tokens` seconds, decode steps of `decode_s`
    and, if given, KV cache growth at `byte_s` seconds a byte."""
    pace = PrefillPace(512)
    for tokens in (4, 64, 256):
        pace.record_prefill(tokens, overhead + per_token * tokens)
    pace.record_decode(decode_s)
    if byte_s is not None:
        pace.record_growth(1000, 1000 * byte_s)
    return pace


CPU = (0.01, 0.002, 0.042)  # a forward's overhead 10 ms, 2 ms a token, a decode step 42 ms: 9 tokens a step
GPU = (0.01, 0.000005, 0.012)  # tokens almost free, a forward's overhead near a decode step: the whole budget


def test_the_fit_tells_a_forwards_overhead_from_its_tokens():
    overhead, per_token = machine(*CPU).cost()
    assert overhead == pytest.approx(0.01) and per_token == pytest.approx(0.002)
    same_size = PrefillPace(512)
    for _ in range(3):
        same_size.record_prefill(20, 0.05)
    assert same_size.cost() == pytest.approx((0.0, 0.0025))  # no size to compare: the ratio alone


def test_what_a_step_may_prefill():
    cpu = machine(*CPU).allowance(decoding=True)
    first = cpu.grant(1000)
    # the first forward pays its overhead out of the allowance: 10 ms + 9 x 2 ms <= 0.7 x 42 ms
    assert first == 9 and 0.01 + 0.002 * (first + 1) > PACE * 0.042 >= 0.01 + 0.002 * first and not cpu.open
    assert machine(*GPU).allowance(decoding=True).grant(1000) == 512
    assert machine(*CPU).allowance(decoding=False).grant(1000) == 512  # nothing decodes: nothing is stalled
    assert PrefillPace(512).allowance(decoding=True).grant(1000) == MIN_CHUNK  # nothing measured yet
    slow = machine(0.01, 0.01, 0.02).allowance(decoding=True)  # one token costs more than the allowance
    assert slow.grant(1000) == MIN_CHUNK
    short = machine(0.003, 0.0005, 0.04).allowance(decoding=True)  # 28 ms: three 9-token prompts at 7.5 ms each
    assert [short.grant(9), short.open, short.grant(9), short.open, short.grant(9), short.open] == \
        [9, True, 9, True, 9, False]


def test_a_burst_of_waiting_prompts_widens_the_allowance_by_their_number():
    one, four = machine(*CPU).allowance(decoding=True, prompts=1), machine(*CPU).allowance(decoding=True, prompts=4)
    assert four.seconds == pytest.approx(4 * one.seconds)
    # four times 29.4 ms: the overhead (10 ms) and 53 tokens at 2 ms; one prompt alone gets its 9
    assert (one.grant(1000), four.grant(1000)) == (9, 53)


def engine_of(tmp_path, rows: int) -> Engine:
    config = ModelConfig(name="tiny", max_batch_size=rows, max_context=64, max_batched_tokens=512, decode_threads=1)
    return Engine(tiny_model(), config, "pace", tmp_path, compile_later=True)


def step_on(engine: Engine, pace: tuple) -> list[Prefill]:
    """One engine step on the machine `pace` describes; the plan's prefills."""
    with torch.inference_mode():
        engine._take_inbox(block=False)
        engine.scheduler.pace = machine(*pace)
        plan = engine.scheduler.schedule()
        events = StepEvents()
        report = engine.executor.run(plan, events)
        events.deliver()
        engine.scheduler.finish(plan, report)
    return plan.prefills


def test_a_long_prompt_beside_decoding_rows_is_prefilled_a_decode_steps_worth_at_a_time(tmp_path):
    engine = engine_of(tmp_path, rows=2)
    running = submit(engine, request(prompt_ids=[1, 2, 3], max_tokens=40, ignore_eos=True, temperature=0.0))
    step_on(engine, CPU)
    long = submit(engine, request(prompt_ids=LONG, max_tokens=2, ignore_eos=True, temperature=0.0), strict=True)
    chunks, tokens = [], []
    while not long.of(Accepted):
        chunks.append([prefill.count for prefill in step_on(engine, CPU)])
        tokens.append(len(running.tokens()))
    assert chunks == [[9]] * 6 + [[6]]  # 60 positions, 9 a step: each step costs the rows 0.7 of a decode step
    assert tokens == list(range(2, 9))  # and the running row took a token in every one of them
    running_alone = engine_of(tmp_path, rows=2)  # nothing decodes beside it: one step, the whole prompt
    submit(running_alone, request(prompt_ids=LONG, max_tokens=2, ignore_eos=True, temperature=0.0))
    assert [prefill.count for prefill in step_on(running_alone, CPU)] == [60]
    on_gpu = engine_of(tmp_path, rows=2)  # a forward's size barely matters: the whole prompt beside the row
    submit(on_gpu, request(prompt_ids=[1, 2, 3], max_tokens=40, ignore_eos=True, temperature=0.0))
    step_on(on_gpu, GPU)
    submit(on_gpu, request(prompt_ids=LONG, max_tokens=2, ignore_eos=True, temperature=0.0))
    assert [prefill.count for prefill in step_on(on_gpu, GPU)] == [60]


def test_a_tenant_running_nothing_has_its_prompt_in_the_next_step_and_no_other_prompt_after_it(tmp_path):
    engine = engine_of(tmp_path, rows=3)
    generous = (0.0001, 0.000001, 1.0)  # the allowance would take every waiting prompt
    long_h = submit(engine, request(prompt_ids=[1, 2, 3], max_tokens=30, ignore_eos=True, tenant="h"))
    short_h = [submit(engine, request(prompt_ids=[1, 4, 5], max_tokens=2, ignore_eos=True, tenant="h"))
               for _ in range(2)]
    waiting_h = [submit(engine, request(prompt_ids=[1, 6, 7], max_tokens=30, ignore_eos=True, tenant="h"))
                 for _ in range(2)]
    step_on(engine, generous)
    step_on(engine, generous)  # the two short requests end: two rows free, h's two others wait
    assert all(run.ended.is_set() for run in short_h) and len(engine.rows) == 1
    quiet = submit(engine, request(prompt_ids=[1, 2, 6, 7], max_tokens=2, ignore_eos=True, tenant="q"))
    prefills = step_on(engine, generous)
    assert [(p.state.request_id, p.count) for p in prefills] == [(quiet.request_id, 3)]
    assert len(quiet.tokens()) == 1  # its first token at the end of that step
    prefills = step_on(engine, generous)  # h's waiting requests start in the step after
    assert [p.state.request_id for p in prefills] == [waiting_h[0].request_id]
    assert len(long_h.tokens()) == 4


def engine_step(engine: Engine, pace: tuple) -> None:
    """One step through `Engine.step`, which takes submissions between the step's prefill forwards."""
    with torch.inference_mode():
        engine._take_inbox(block=False)
        engine.scheduler.pace = machine(*pace)
        engine.step()


def arriving(engine: Engine, tenant: str, arrivals: list[Run]) -> Run:
    """A request of tenant h whose sink submits one request of `tenant` when its prompt starts: an arrival while
    the engine runs the step's prefill forwards."""
    prepared = engine.prepare(request(prompt_ids=[1, 6, 7], max_tokens=30, ignore_eos=True, tenant="h"))
    run = Run(prepared.request.request_id)

    def sink(batch: list) -> None:
        run.sink(batch)
        if any(isinstance(event, Accepted) for event in batch):
            arrivals.append(submit(engine, request(prompt_ids=[1, 2, 6, 7], max_tokens=2, ignore_eos=True,
                                                   tenant=tenant)))

    engine.submit(prepared, sink)
    return run


def test_a_tenant_running_nothing_that_arrives_mid_step_has_its_prompt_next_and_the_rest_waits(tmp_path):
    engine = engine_of(tmp_path, rows=4)
    generous = (0.0001, 0.000001, 1.0)  # the allowance would take every waiting prompt
    quiet: list[Run] = []
    first_h = arriving(engine, "q", quiet)
    other_h = [submit(engine, request(prompt_ids=[1, 6, 7], max_tokens=30, ignore_eos=True, tenant="h"))
               for _ in range(2)]
    engine_step(engine, generous)  # planned: h's three prompts; q arrives after the first one's forward
    assert first_h.of(Accepted) and len(first_h.tokens()) == 1
    assert quiet[0].of(Accepted) and len(quiet[0].tokens()) == 1  # its first token in the step it arrived in
    assert not any(run.of(Accepted) for run in other_h)  # h's other prompts went back to the queue's front...
    assert [s.request_id for s in engine.scheduler.waiting] == [run.request_id for run in other_h]
    engine_step(engine, generous)  # ...and start in the next step, in their order
    assert all(len(run.tokens()) == 1 for run in other_h) and len(first_h.tokens()) == 2
    assert not engine.scheduler.waiting


def test_a_mid_step_arrival_of_a_tenant_already_running_changes_nothing_in_the_step(tmp_path):
    engine = engine_of(tmp_path, rows=4)
    generous = (0.0001, 0.000001, 1.0)
    later_h: list[Run] = []
    first_h = arriving(engine, "h", later_h)  # h's own next request arrives while h's prompts are prefilled
    other_h = [submit(engine, request(prompt_ids=[1, 6, 7], max_tokens=30, ignore_eos=True, tenant="h"))
               for _ in range(2)]
    engine_step(engine, generous)
    assert all(len(run.tokens()) == 1 for run in [first_h, *other_h])  # the step ran as planned
    assert not later_h[0].of(Accepted) and [s.request_id for s in engine.scheduler.waiting] == [later_h[0].request_id]


def test_a_prompt_partly_prefilled_steps_aside_for_a_tenant_running_nothing_and_goes_on_where_it_stopped(tmp_path):
    def long_beside_a_row(quiet_after: int | None) -> tuple[Engine, Run, list[list[tuple[int, int]]]]:
        """h runs a row and has LONG prefilled 9 tokens a step; q's request arrives after `quiet_after` steps."""
        engine = engine_of(tmp_path, rows=3)
        submit(engine, request(prompt_ids=[1, 2, 3], max_tokens=40, ignore_eos=True, temperature=0.0, tenant="h"))
        step_on(engine, CPU)
        long = submit(engine, request(prompt_ids=LONG, max_tokens=3, ignore_eos=True, temperature=0.0, logprobs=1,
                                      tenant="h"), strict=True)
        chunks = []
        while not long.ended.is_set():
            if len(chunks) == quiet_after:
                submit(engine, request(prompt_ids=[1, 2, 6, 7], max_tokens=2, ignore_eos=True, tenant="q"))
            chunks.append([(p.state.prepared.request.tenant, p.start, p.count) for p in step_on(engine, CPU)])
        return engine, long, chunks

    _, alone, chunks_alone = long_beside_a_row(None)
    _, long, chunks = long_beside_a_row(2)
    assert chunks[:2] == chunks_alone[:2] == [[("h", 0, 9)], [("h", 9, 9)]]
    assert chunks[2] == [("q", 0, 3)]  # q's prompt first, alone: h's prompt set aside after 18 positions
    assert chunks[3] == [("h", 18, 9)]  # it goes on where it stopped, from its own cache positions
    assert chunks[3:] == chunks_alone[2:]
    assert [(t.token_id, t.logprob) for t in long.tokens()] == [(t.token_id, t.logprob) for t in alone.tokens()]


def test_beside_decoding_rows_the_cache_grows_a_layer_a_step_ahead_of_the_prompt(tmp_path):
    """A prompt longer than the cache holds: one layer grows per step (the rest of the allowance prefills), the
    prompt's chunks stay below what every layer holds; the rows decoding meanwhile (scripted layers, their
    layers of two sizes) and the prompt give what they give without each other."""
    loaded = tiny_model(layers=36, positions=1024)
    # one token per decode step (the count below): no prompt-lookup drafts, which this repetitive tiny model accepts
    config = ModelConfig(name="tiny", max_batch_size=3, max_context=1024, max_batched_tokens=512, decode_threads=1,
                         prompt_lookup=False)
    engine = Engine(loaded, config, "grow", tmp_path)
    cache = engine.runner.cache
    slow_growth = (0.01, 0.002, 0.042, 1.0)  # growing a layer takes the whole allowance: 8-token chunks
    shorts = [request(prompt_ids=p, max_tokens=60, ignore_eos=True, temperature=0.0, logprobs=0)
              for p in ([1, 2, 3], [1, 4])]
    running = [submit(engine, short) for short in shorts]
    step_on(engine, slow_growth)
    prompt = [1, *([2, 3, 5, 6, 7, 4, 5] * 43)]  # 302 tokens: the cache grows from 256 to 384 positions
    long = submit(engine, request(prompt_ids=prompt, max_tokens=3, ignore_eos=True, temperature=0.0), strict=True)
    steps = 0
    while not long.of(Accepted):
        held, grown = cache.capacity, sum(c == 384 for c in cache.capacities)
        prefills = step_on(engine, slow_growth)
        steps += 1
        assert all(p.start + p.count < held for p in prefills)  # a chunk never waits for a layer to grow
        assert sum(c == 384 for c in cache.capacities) - grown == (grown < 36)
        assert [len(run.tokens()) for run in running] == [1 + steps] * 2
    # 8 tokens a step (the floor) and one of 7 reach the 255 positions held, 4 steps wait for the last layers,
    # then 9 a step: 32 + 4 + 6 steps
    assert cache.capacities == [384] * 36 and steps == 42
    while not all(run.ended.is_set() for run in [long, *running]):
        step_on(engine, slow_growth)
    alone = Engine(loaded, config, "alone", tmp_path)  # the same requests apart: the cache never grows a layer
    references = [submit(alone, short) for short in shorts]
    while not all(run.ended.is_set() for run in references):
        step_on(alone, slow_growth)
    whole = submit(alone, request(prompt_ids=prompt, max_tokens=3, ignore_eos=True, temperature=0.0))
    while not whole.ended.is_set():  # nothing decodes beside it: prefilled in one step, the cache grown at once
        step_on(alone, slow_growth)
    assert [run.finishes[0].token_ids for run in [long, *running]] == \
        [run.finishes[0].token_ids for run in [whole, *references]]
    assert [[t.logprob for t in run.tokens()] for run in running] == \
        [[t.logprob for t in run.tokens()] for run in references]
    first = loaded.model.generate(torch.tensor([prompt]), max_new_tokens=1, do_sample=False)[0, -1].item()
    assert whole.finishes[0].token_ids[0] == first


def test_where_growing_is_cheap_the_layers_a_prompt_needs_grow_in_its_first_step(tmp_path):
    config = ModelConfig(name="tiny", max_batch_size=2, max_context=1024, max_batched_tokens=512, decode_threads=1)
    engine = Engine(tiny_model(layers=4, positions=1024), config, "grow", tmp_path, compile_later=True)
    cheap_growth = (0.01, 0.002, 0.042, 1e-12)
    submit(engine, request(prompt_ids=[1, 2, 3], max_tokens=20, ignore_eos=True))
    step_on(engine, cheap_growth)
    submit(engine, request(prompt_ids=[1, *([2, 3, 5, 6, 7, 4, 5] * 43)], max_tokens=2, ignore_eos=True))
    assert [p.count for p in step_on(engine, cheap_growth)] == [9]
    assert engine.runner.cache.capacities == [384] * 4
