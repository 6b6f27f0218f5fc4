"""Preemption for fairness (worker/engine/preemption.py): a tenant with nothing running takes a row from the
most-served tenant when the batch is full, and the parked request resumes exactly: its tokens equal those of
the same request never parked (transformers generate() for greedy, the same engine alone for seeded sampling).
Real Engines on a tiny random Llama, stepped by hand so the preemption happens at a known step."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from common.protocol import Finish, ModelConfig, Token
from testkit.tiny_model import tiny_llama
from tests.worker.beam.tiny import tiny_model
from tests.worker.engine.runs import request, submit
from worker.engine import runner_choice
from worker.engine.engine import Engine
from worker.engine.hf_runner import TransformersRunner
from worker.engine.preemption import choose_victims
from worker.engine.sequence import RequestState

PROMPTS = [[1, 2, 3, 4, 5], [1, 5, 6, 7, 2, 3], [1, 7, 7, 2]]


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=5, sharpness=1.0)  # flat enough that sampling varies, peaked enough for greedy


def engine_of(model, tmp_path, rows: int, **settings) -> Engine:
    config = ModelConfig(name="tiny", max_batch_size=rows, max_context=64, decode_threads=1, **settings)
    return Engine(model, config, "preempt", tmp_path, compile_later=True)


def steps_until_done(engine: Engine, runs: list, limit: int = 200) -> None:
    with torch.inference_mode():
        for _ in range(limit):
            if all(run.ended.is_set() for run in runs):
                return
            engine._take_inbox(block=False)
            engine.step()
    raise AssertionError("the requests did not finish")


def step(engine: Engine, count: int) -> None:
    with torch.inference_mode():
        for _ in range(count):
            engine._take_inbox(block=False)
            engine.step()


def hostile_then_quiet(engine: Engine, params: dict, quiet_prompt: list[int] = PROMPTS[2]) -> tuple[list, object]:
    """Tenant h fills both rows with long requests; after three steps tenant q asks for two tokens."""
    hostile = [submit(engine, request(prompt_ids=p, max_tokens=12, ignore_eos=True, tenant="h", **params), strict=True)
               for p in PROMPTS[:2]]
    step(engine, 3)
    quiet = submit(engine, request(prompt_ids=quiet_prompt, max_tokens=2, ignore_eos=True, tenant="q", **params),
                   strict=True)
    return hostile, quiet


def test_a_quiet_tenant_takes_a_row_at_once_and_greedy_output_equals_generate(model, tmp_path):
    engine = engine_of(model, tmp_path, rows=2)
    hostile, quiet = hostile_then_quiet(engine, {"temperature": 0.0})
    before = len(hostile[0].tokens())
    step(engine, 1)
    assert engine.scheduler.preemptions == 1
    assert sorted(row.request.prepared.request.tenant for row in engine.rows) == ["h", "q"]
    assert len(hostile[0].tokens()) == before  # the row left running sat out the newcomer's first step
    # the newest hostile request was parked mid-way and waits at the front; the quiet one decoded at once
    parked = engine.scheduler.waiting[0]
    assert parked.request_id == hostile[1].request_id and len(parked.parked) == 1
    assert len(quiet.tokens()) == 1 and 0 < len(parked.sequences[0].output_ids) < 12
    steps_until_done(engine, [*hostile, quiet])
    assert engine.scheduler.preemptions == 1  # the parked request resumed; nothing parked back
    for run, prompt in zip([*hostile, quiet], PROMPTS):
        length = len(run.finishes[0].token_ids)
        expected = model.model.generate(torch.tensor([prompt]), max_new_tokens=length, min_new_tokens=length,
                                        do_sample=False)[0, len(prompt):].tolist()
        assert run.finishes[0].token_ids == expected
        assert [t.token_id for t in run.tokens()] == expected  # streamed once each, none repeated or lost
    assert len(quiet.finishes[0].token_ids) == 2


@pytest.mark.parametrize("params", [
    {"temperature": 1.0, "seed": [7]},
    {"temperature": 0.9, "top_p": 0.9, "seed": [3], "repetition_penalty": 1.3, "presence_penalty": 0.5,
     "frequency_penalty": 0.3, "no_repeat_ngram_size": 3},
])
def test_seeded_sampling_resumes_exactly(model, tmp_path, params):
    engine = engine_of(model, tmp_path, rows=2)
    hostile, quiet = hostile_then_quiet(engine, params)
    steps_until_done(engine, [*hostile, quiet])
    assert engine.scheduler.preemptions == 1
    alone = engine_of(model, tmp_path, rows=2)  # the same requests one at a time: never parked
    for run, prompt in zip([*hostile, quiet], PROMPTS):
        reference = submit(alone, request(prompt_ids=prompt, max_tokens=len(run.finishes[0].token_ids),
                                          ignore_eos=True, **params))
        steps_until_done(alone, [reference])
        assert run.finishes[0].token_ids == reference.finishes[0].token_ids
        assert run.finishes[0].cumulative_logprob == pytest.approx(reference.finishes[0].cumulative_logprob)


def test_cancelling_a_parked_request_ends_it_with_its_usage_so_far(model, tmp_path):
    engine = engine_of(model, tmp_path, rows=2)
    hostile, quiet = hostile_then_quiet(engine, {"temperature": 0.0})
    step(engine, 1)
    parked = engine.scheduler.waiting[0]
    engine.cancel(parked.request_id)
    steps_until_done(engine, [*hostile, quiet])
    tokens = [t.token_id for t in hostile[1].tokens()]
    assert tokens == parked.sequences[0].output_ids and hostile[1].done.completion_tokens == len(tokens) > 0
    assert hostile[0].finishes[0].reason == "length" and len(quiet.finishes[0].token_ids) == 2
    assert engine.scheduler.queued == 0 and not engine.scheduler.waiting


def test_a_newcomer_cancelled_mid_prompt_leaves_nothing_waiting_on_it(model, tmp_path):
    """Rows were parked for a newcomer whose prompt takes several steps; it is cancelled before its first token.
    The scheduler lets it go (no later step waits for its first token) and the parked rows end as they would."""
    engine = engine_of(model, tmp_path, rows=2, max_batched_tokens=16)
    long_prompt = [1, *([2, 3, 4, 5, 6, 7] * 7)]  # 43 tokens: three steps of at most 16
    hostile, quiet = hostile_then_quiet(engine, {}, quiet_prompt=long_prompt)
    step(engine, 1)
    newcomer = engine.scheduler.made_room_for
    assert newcomer is not None and engine.scheduler.preemptions == 1 and not quiet.tokens()
    engine.cancel(newcomer.request_id)
    steps_until_done(engine, [*hostile, quiet])
    assert engine.scheduler.made_room_for is None
    assert [len(run.finishes[0].token_ids) for run in hostile] == [12, 12] and not quiet.tokens()
    assert engine.scheduler.queued == 0 and not engine.scheduler.waiting


def waiting_state(engine: Engine, tenant: str, **params) -> RequestState:
    return RequestState(engine.prepare(request(prompt_ids=PROMPTS[0], max_tokens=8, tenant=tenant, **params)),
                        lambda events: None)


def test_who_may_be_parked(model, tmp_path):
    engine = engine_of(model, tmp_path, rows=4)
    runs = [submit(engine, request(prompt_ids=PROMPTS[0], max_tokens=30, ignore_eos=True, tenant=t, **extra))
            for t, extra in (("h", {}), ("h", {}), ("h", {}), ("b", {}))]
    step(engine, 2)
    rows = engine.rows
    assert len(rows) == 4 and not engine.scheduler.waiting
    newest_h = max((row.request for row in rows if row.request.prepared.request.tenant == "h"),
                   key=lambda state: state.admitted)
    # a tenant running nothing takes h's newest row (h runs the most); never b's only row
    assert [row.request for row in choose_victims(waiting_state(engine, "q"), rows, 4, 0)] == [newest_h]
    # two rows: h keeps one of its three, fewer than the newcomer's two: nobody is parked
    assert choose_victims(waiting_state(engine, "q", n=2, temperature=1.0), rows, 4, 0) == []
    # a tenant already running rows waits its turn; so does anyone once max_rows rows are parked
    assert choose_victims(waiting_state(engine, "b"), rows, 4, 0) == []
    assert choose_victims(waiting_state(engine, "q"), rows, 4, 4) == []
    for run in runs:
        engine.cancel(run.request_id)
    step(engine, 1)


def test_multi_row_requests_give_rows_one_at_a_time_and_beams_whole(model, tmp_path):
    engine = engine_of(model, tmp_path, rows=4)
    beams = submit(engine, request(prompt_ids=PROMPTS[0], max_tokens=20, num_beams=2, tenant="h"))
    sampled = submit(engine, request(prompt_ids=PROMPTS[1], max_tokens=20, n=2, temperature=1.0, ignore_eos=True,
                                     tenant="h"))
    step(engine, 2)
    assert len(engine.rows) == 4
    newest = sorted((row for row in engine.rows if row.request.request_id == sampled.request_id),
                    key=lambda row: row.candidate)
    # the newest request's last candidate alone; then its other candidate; h keeps as many rows as q takes
    assert choose_victims(waiting_state(engine, "q"), engine.rows, 4, 0) == [newest[1]]
    assert choose_victims(waiting_state(engine, "q", n=2, temperature=1.0), engine.rows, 4, 0) == newest[::-1]
    # three rows: h would keep fewer than three after the second, and its beam search is not wider: none
    assert choose_victims(waiting_state(engine, "q", n=3, temperature=1.0), engine.rows, 4, 0) == []
    for run in (beams, sampled):
        engine.cancel(run.request_id)
    step(engine, 1)


def test_a_beam_search_wider_than_the_newcomer_is_parked_whole(model, tmp_path):
    engine = engine_of(model, tmp_path, rows=4)
    submit(engine, request(prompt_ids=PROMPTS[0], max_tokens=20, num_beams=4, tenant="h"))
    step(engine, 2)
    assert len(engine.rows) == 4
    assert choose_victims(waiting_state(engine, "q"), engine.rows, 4, 0) == engine.rows  # all four, in slot order
    assert choose_victims(waiting_state(engine, "q", n=4, temperature=1.0), engine.rows, 4, 0) == []  # not wider
    assert choose_victims(waiting_state(engine, "q"), engine.rows, 4, 1) == []  # four more would exceed max_rows


def test_finish_events_once(model, tmp_path):
    engine = engine_of(model, tmp_path, rows=2)
    hostile, quiet = hostile_then_quiet(engine, {"temperature": 0.0})
    steps_until_done(engine, [*hostile, quiet])
    for run in [*hostile, quiet]:
        assert len(run.of(Finish)) == 1 and len(run.of(Token)) == len(run.finishes[0].token_ids)


def test_a_parked_request_with_a_cached_prompt_resumes_from_its_own_cache(model, tmp_path):
    """Prompts of several prefix-cache blocks: once prefilled they are in the prefix cache, and the parked one
    must come back with its own saved positions (not re-read from the cache) and still equal generate()."""
    engine = engine_of(model, tmp_path, rows=2)
    prompts = [[1] + [(i * 3 + k) % 7 + 1 for i in range(39)] for k in range(3)]
    hostile = [submit(engine, request(prompt_ids=p, max_tokens=10, ignore_eos=True, tenant="h", temperature=0.0),
                      strict=True) for p in prompts[:2]]
    step(engine, 3)
    quiet = submit(engine, request(prompt_ids=prompts[2], max_tokens=2, ignore_eos=True, tenant="q",
                                   temperature=0.0), strict=True)
    steps_until_done(engine, [*hostile, quiet])
    assert engine.scheduler.preemptions == 1
    for run, prompt in zip([*hostile, quiet], prompts):
        length = len(run.finishes[0].token_ids)
        expected = model.model.generate(torch.tensor([prompt]), max_new_tokens=length, min_new_tokens=length,
                                        do_sample=False)[0, len(prompt):].tolist()
        assert run.finishes[0].token_ids == expected
        assert [t.token_id for t in run.tokens()] == expected


@pytest.mark.parametrize("params", [
    {"n": 4, "temperature": 1.0, "seed": [11]},
    {"n": 2, "best_of": 4, "temperature": 0.9, "top_k": 20, "seed": [5], "repetition_penalty": 1.2},
    {"num_beams": 4, "temperature": 0.0},
])
def test_one_request_holding_every_row_gives_a_newcomer_a_row_within_two_steps(model, tmp_path, params):
    """One tenant's single request takes all four rows (`n`, `best_of` or beams); another tenant's request
    decodes its first token within two engine steps of arriving, and every output equals the same request
    run alone, never parked."""
    engine = engine_of(model, tmp_path, rows=4)
    hostile = submit(engine, request(prompt_ids=PROMPTS[0], max_tokens=14, ignore_eos=True, tenant="h", **params),
                     strict=True)
    step(engine, 3)
    assert len(engine.rows) == 4
    quiet = submit(engine, request(prompt_ids=PROMPTS[2], max_tokens=3, ignore_eos=True, tenant="q",
                                   temperature=0.0), strict=True)
    step(engine, 2)
    assert quiet.tokens(), "the newcomer waited more than two steps for a row"
    assert engine.scheduler.preemptions == 1
    steps_until_done(engine, [hostile, quiet])
    alone = engine_of(model, tmp_path, rows=4)
    reference = submit(alone, request(prompt_ids=PROMPTS[0], max_tokens=14, ignore_eos=True, **params))
    steps_until_done(alone, [reference])
    assert [f.token_ids for f in hostile.finishes] == [f.token_ids for f in reference.finishes]
    assert [f.cumulative_logprob for f in hostile.finishes] == \
        pytest.approx([f.cumulative_logprob for f in reference.finishes])
    assert engine.scheduler.queued == 0 and not engine.scheduler.waiting


@pytest.mark.parametrize("runner", ["lean", "fallback", "q4"])
def test_the_newcomers_first_token_comes_from_a_step_of_its_rows_alone(runner, smol_tokenizer, tmp_path,
                                                                       monkeypatch):
    """The rows left running sit out the step that gives the newcomer its first token, whatever runner decodes it
    (the lean torch forward, transformers' own, the native q4 one: the newcomer's rows sit in slots after the
    others); every output equals the same request's alone, and the newcomer ends by its own limit."""
    loaded = tiny_llama(smol_tokenizer, seed=3)
    if runner == "q4":
        loaded = dataclasses.replace(loaded, quantization="q4")
    if runner == "fallback":
        monkeypatch.setattr(runner_choice, "LEAN_MODEL_TYPES", frozenset())

    def engine() -> Engine:
        built = Engine(loaded, ModelConfig(name="tiny", max_batch_size=3, max_context=64, decode_threads=1),
                       "alone", tmp_path, compile_later=True)
        assert (built.runner.native is not None) == (runner == "q4")
        assert isinstance(built.runner, TransformersRunner) == (runner == "fallback")
        return built

    wide = dict(prompt="The river", n=3, seed=[5, 6, 7], temperature=0.9, max_tokens=10, ignore_eos=True,
                logprobs=1)
    quiet_params = dict(prompt="One two three", temperature=0.0, max_tokens=1, ignore_eos=True, logprobs=1)
    batch = engine()
    hostile = submit(batch, request(tenant="h", **wide), strict=True)
    step(batch, 3)
    quiet = submit(batch, request(tenant="q", **quiet_params), strict=True)
    held = [len(hostile.tokens(i)) for i in range(3)]
    step(batch, 1)
    assert batch.scheduler.preemptions == 1 and len(quiet.tokens()) == 1
    assert quiet.ended.is_set()  # by its own limit, not another row's
    assert [len(hostile.tokens(i)) for i in range(3)] == held  # parked, or sat the step out
    steps_until_done(batch, [hostile, quiet])
    for run, params in [(hostile, wide), (quiet, quiet_params)]:
        alone = engine()
        reference = submit(alone, request(**params), strict=True)
        steps_until_done(alone, [reference])
        assert [f.token_ids for f in run.finishes] == [f.token_ids for f in reference.finishes]
        logprobs = [[t.logprob for t in run.tokens(i)] for i in range(len(run.finishes))]
        expected = [[t.logprob for t in reference.tokens(i)] for i in range(len(run.finishes))]
        if runner == "q4":  # batch-invariant: the same bits
            assert logprobs == expected
        else:
            assert logprobs == [pytest.approx(row, abs=1e-5) for row in expected]
