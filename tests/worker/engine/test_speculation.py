"""Speculative decoding (worker/engine/speculation.py, drafts.py) on a tiny random Llama: rows that carry draft
tokens (a prediction, prompt lookup) emit exactly the tokens of decoding one at a time — greedy against
transformers `generate()` in the exact mode and against the engine without speculation in q4 (the native forward
is batch-invariant) — with penalties, bans, n-gram bans, stops, logprobs and seeded sampling, and a draft from a
point-mass proposal keeps the target distribution."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest

from common.protocol import Constraint, ModelConfig
from gateway.config import load_settings
from testkit.tiny_model import tiny_llama
from tests.worker.engine.runs import Run, request, running_engine
from tests.worker.lora.adapters import greedy
from worker.engine.drafts import STEP_TOKENS, Drafter, draft_length

PROMPT = "The ferry crossed the river at dawn. The ferry crossed the river at dawn. The ferry crossed the"
CONFIG = dict(max_batch_size=8, max_context=256, grammar_compile_timeout_s=300)  # a busy CI box compiles slowly


@pytest.fixture(scope="module")
def tiny(smol_cpu):
    return tiny_llama(smol_cpu.tokenizer, seed=5)


@pytest.fixture(scope="module", params=["none", "q4"])
def engines(request, tiny):
    """(mode, with speculation, without) on the same weights, in the exact mode or q4."""
    mode = request.param
    loaded = tiny if mode == "none" else dataclasses.replace(tiny, model=copy.deepcopy(tiny.model), quantization="q4")
    with running_engine(loaded, "spec", **CONFIG) as on, \
            running_engine(loaded, "plain", prompt_lookup=False, **CONFIG) as off:
        assert (on.runner.native is not None) == (mode == "q4")
        yield mode, on, off


def serve(engine, generate, prediction_ids: list[int] | None = None) -> Run:
    """`generate` served, with draft tokens from `prediction_ids` (the prediction's tokens, set past prepare so a
    test controls them to the token)."""
    prepared = engine.prepare(generate)
    prepared.prediction_ids = prediction_ids
    run = Run(generate.request_id, strict=True)
    engine.submit(prepared, run.sink)
    return run.wait()


def logprob_lists(run: Run, index: int = 0) -> list:
    return [(t.logprob, [(x.token_id, x.logprob) for x in t.top_logprobs or []]) for t in run.tokens(index)]


def flat(run: Run) -> list[float]:
    return [value for logprob, top in logprob_lists(run) for value in [logprob, *(lp for _, lp in top)]]


def test_greedy_with_drafts_gives_the_tokens_of_decoding_one_at_a_time(tiny, engines):
    mode, on, off = engines
    ids = tiny.tokenizer(PROMPT).input_ids
    plain = serve(off, request(prompt_ids=ids, max_tokens=24, temperature=0, ignore_eos=True))
    reference = plain.finishes[0].token_ids
    if mode == "none":
        assert reference == greedy(tiny.model, ids, 24, tiny.tokenizer.eos_token_id)
    right = serve(on, request(prompt_ids=ids, max_tokens=24, temperature=0, ignore_eos=True), reference)
    assert right.finishes[0].token_ids == reference
    assert right.done.accepted_prediction_tokens >= 12  # most of it came through drafts
    assert right.done.completion_tokens == 24 + right.done.rejected_prediction_tokens
    wrong = reference[:5] + [(t + 7) % 1000 for t in reference[5:10]] + reference[10:]
    edited = serve(on, request(prompt_ids=ids, max_tokens=24, temperature=0, ignore_eos=True), wrong)
    assert edited.finishes[0].token_ids == reference
    assert edited.done.rejected_prediction_tokens > 0
    lookup = serve(on, request(prompt_ids=ids, max_tokens=24, temperature=0, ignore_eos=True))
    assert lookup.finishes[0].token_ids == reference  # prompt lookup alone
    assert lookup.done.accepted_prediction_tokens == lookup.done.rejected_prediction_tokens == 0


FEATURES = {
    "penalties": dict(temperature=0, repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.3),
    "bans": dict(temperature=0, bad_words=[" river"], no_repeat_ngram_size=3),
    "logprobs": dict(temperature=0, logprobs=4, min_tokens=6),
    "sampling": dict(temperature=0.9, top_p=0.95, top_k=50, seed=[11], logprobs=2),
    "stop": dict(temperature=0, stop=[" dawn"], stop_token_ids=[13]),
    "grammar": dict(temperature=0, constraint=Constraint("regex", "[a-z ]{4,40}[.]")),
}


@pytest.mark.parametrize("feature", FEATURES)
def test_every_logits_feature_holds_position_by_position(tiny, engines, feature):
    """The prediction is the plain engine's own output, so every draft is checked under the feature's processing
    as it stood at that position: a wrongly processed position would reject (or change) a token."""
    mode, on, off = engines
    params = dict(max_tokens=20, **FEATURES[feature])
    plain = serve(off, request(PROMPT, **params))
    reference = plain.finishes[0].token_ids
    drafted = serve(on, request(PROMPT, **params), reference + [5, 6, 7])
    assert drafted.finishes[0].token_ids == reference
    assert drafted.finishes[0].text == plain.finishes[0].text
    if mode == "q4":  # one native forward, batch-invariant: bitwise the same
        assert logprob_lists(drafted) == logprob_lists(plain)
    else:  # the drafts' own chunk forward rounds as a prompt chunk does (prefix_cache.py: within 1e-5)
        assert flat(drafted) == pytest.approx(flat(plain), abs=1e-5)
    if len(reference) > 2:
        assert drafted.done.accepted_prediction_tokens > 0


def test_n_candidates_each_draft_on_their_own_and_keep_their_seeds(tiny, engines):
    _, on, off = engines
    params = dict(max_tokens=16, temperature=1.0, n=2, seed=[3])
    plain = serve(off, request(PROMPT, **params))
    drafted = serve(on, request(PROMPT, **params), plain.finishes[0].token_ids)
    assert [f.token_ids for f in drafted.finishes] == [f.token_ids for f in plain.finishes]


def test_rejected_positions_never_reach_a_later_request(tiny, engines):
    """A request whose drafts were all refused leaves garbage past its rows' lengths; the prompt's cached prefix
    and the next request's tokens are untouched by it."""
    _, on, off = engines
    ids = tiny.tokenizer(PROMPT * 2).input_ids
    params = dict(max_tokens=12, temperature=0, ignore_eos=True)
    reference = serve(off, request(prompt_ids=ids, **params)).finishes[0].token_ids
    junk = [(t + 1) % 1000 for t in reference]
    refused = serve(on, request(prompt_ids=ids, tenant="a", **params), junk)
    assert refused.finishes[0].token_ids == reference and refused.done.rejected_prediction_tokens > 0
    again = serve(on, request(prompt_ids=ids, tenant="a", **params))
    assert again.done.cached_tokens > 0 and again.finishes[0].token_ids == reference


def test_a_drafted_token_is_accepted_as_often_as_the_model_samples_it(tiny, smol_cpu):
    """The rejection rule with a point-mass proposal keeps the target distribution: with a one-token draft t for the
    first position, the first token equals t in a share of seeds within 4 sigma of p(t) under the model."""
    import torch
    ids = tiny.tokenizer("The ferry crossed").input_ids
    with torch.inference_mode():
        probs = torch.softmax(tiny.model(torch.tensor([ids])).logits[0, -1].float(), dim=-1)
    draft = int(probs.argsort(descending=True)[1])  # the second likeliest: p well inside (0, 1)
    p = float(probs[draft])
    trials = 150
    with running_engine(tiny, "stat", **CONFIG) as engine:
        runs = [serve(engine, request(prompt_ids=ids, max_tokens=2, temperature=1.0, seed=[seed], ignore_eos=True),
                      [draft, draft]) for seed in range(trials)]
    hits = sum(run.finishes[0].token_ids[0] == draft for run in runs)
    assert sum(run.done.accepted_prediction_tokens + run.done.rejected_prediction_tokens for run in runs) >= trials
    assert abs(hits / trials - p) <= 4 * math.sqrt(p * (1 - p) / trials) + 1e-9


def test_a_prediction_cursor_follows_the_output_and_finds_it_again_after_an_edit():
    prediction = list(range(100, 140))
    drafter = Drafter(prompt=[1, 2, 3], prediction=prediction, lookup=False)
    assert drafter.propose([], tokens=1, room=4) == [100, 101, 102, 103]
    output = [100, 101, 102, 999, 998]  # an edit at the fourth token
    assert drafter.propose(output, tokens=1, room=4) == []  # lost: nothing follows 999, 998 in the prediction
    output += [105, 106]  # the output rejoins the prediction
    assert drafter.propose(output, tokens=1, room=4) == [107, 108, 109, 110]


def test_a_run_along_the_prediction_drafts_as_far_as_it_went_whatever_the_average():
    prediction = list(range(100, 140))
    drafter = Drafter(prompt=[1, 2, 3], prediction=prediction, lookup=False)
    drafter.from_prediction.alpha = 0.5  # after refusals, the average alone offers one token
    assert drafter.propose([100, 101], tokens=1, room=16) == [102, 103]
    assert drafter.propose(list(range(100, 110)), tokens=1, room=16) == list(range(110, 120))
    assert drafter.propose(list(range(100, 110)) + [7], tokens=1, room=16) == []  # an edit ends the run
    drafter.from_prediction.alpha = 0.2  # where drafting does not pay, a run does not override it
    assert drafter.propose(list(range(100, 120)), tokens=1, room=16) == []


def test_draft_lengths_follow_acceptance_and_a_full_batch_drafts_nothing():
    assert draft_length(0.95, tokens=1, limit=16) == 16
    assert 0 < draft_length(0.6, tokens=1, limit=16) < 6
    assert draft_length(0.45, tokens=1, limit=16) == 1
    assert draft_length(0.3, tokens=1, limit=16) == 0
    assert draft_length(0.6, tokens=8, limit=16) < draft_length(0.6, tokens=1, limit=16)
    lookup = Drafter(prompt=[1, 2, 3, 4, 5, 6, 1, 2, 3], lookup=True)
    assert lookup.propose([], tokens=1, room=STEP_TOKENS - 1) == [4]  # "1 2 3" was followed by "4 5 6 ..."
    assert lookup.propose([], tokens=1, room=0) == []


def test_prompt_lookup_off_drafts_only_from_a_prediction(tiny):
    with running_engine(tiny, "off", prompt_lookup=False, **CONFIG) as engine:
        ids = tiny.tokenizer(PROMPT).input_ids
        before = engine.steps
        plain = serve(engine, request(prompt_ids=ids, max_tokens=8, temperature=0, ignore_eos=True))
        assert engine.steps - before == 8  # a step per token: no lookup drafts
        predicted = serve(engine, request(prompt_ids=ids, max_tokens=8, temperature=0, ignore_eos=True),
                          plain.finishes[0].token_ids)
        assert predicted.done.accepted_prediction_tokens > 0


def test_prompt_lookup_is_a_per_model_setting(tmp_path):
    assert ModelConfig().prompt_lookup is True
    config = tmp_path / "sluice.toml"
    config.write_text('[[models]]\nprompt_lookup = "no"\n')
    with pytest.raises(SystemExit, match="prompt_lookup"):
        load_settings(str(config))
    config.write_text("[[models]]\nprompt_lookup = false\n")
    assert load_settings(str(config)).models[0].worker_config().prompt_lookup is False


def test_drafts_are_checked_as_a_step_checks_a_row_whatever_torch_threads_the_worker_has(tiny):
    """A worker on a host of 4+ cores has a team of torch threads. A step of a few rows processes their logits on
    one thread (executor.logits_threads), and so must each draft position: a team splits one row's log-sum-exp
    over the vocabulary and rounds it otherwise, so logprobs (and a sampled row's draws) would differ."""
    import torch
    loaded = dataclasses.replace(tiny, model=copy.deepcopy(tiny.model), quantization="q4")
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # the engines' threads start with it
    try:
        with running_engine(loaded, "team-spec", **CONFIG) as on, \
                running_engine(loaded, "team-plain", prompt_lookup=False, **CONFIG) as off:
            params = dict(max_tokens=48, temperature=0, logprobs=5, ignore_eos=True)
            plain = serve(off, request(PROMPT, **params))
            drafted = serve(on, request(PROMPT, **params), plain.finishes[0].token_ids)
    finally:
        torch.set_num_threads(before)
    assert drafted.done.accepted_prediction_tokens >= 24
    assert logprob_lists(drafted) == logprob_lists(plain)
