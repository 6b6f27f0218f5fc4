"""Friendli's XTC sampling and forced outputs, checked against the model's own probabilities."""

from __future__ import annotations

import pytest
import torch

from tests.worker.engine.runs import generate, request
from worker.engine.prepare import RequestRejected

PROMPT = "The capital of France is"


def model_logprobs(smol, ids: list[int]) -> torch.Tensor:
    """log_softmax of the plain model at every position of `ids`."""
    with torch.inference_mode():
        return torch.log_softmax(smol.model(torch.tensor([ids], device=smol.model.device)).logits[0].float(), dim=-1)


def test_forced_outputs_come_first_with_the_models_logprobs(engine, smol):
    forced = smol.tokenizer(" Lyon, a city", add_special_tokens=False).input_ids
    run = generate(engine, PROMPT, max_tokens=len(forced) + 3, temperature=0, logprobs=0,
                   forced_output_tokens=forced)
    finish = run.finishes[0]
    assert finish.token_ids[: len(forced)] == forced
    prompt = smol.tokenizer(PROMPT).input_ids
    logprobs = model_logprobs(smol, prompt + finish.token_ids)
    for step, token in enumerate(run.tokens()):
        expected = logprobs[len(prompt) - 1 + step, token.token_id]
        assert token.logprob == pytest.approx(float(expected), abs=1e-4)
    # after the forced prefix, generation goes on greedily from it
    assert finish.token_ids[len(forced)] == int(logprobs[len(prompt) - 1 + len(forced)].argmax())


def test_forced_outputs_outside_the_vocabulary_are_refused(engine):
    with pytest.raises(RequestRejected) as refused:
        engine.prepare(request(PROMPT, max_tokens=3, forced_output_tokens=[10**7]))
    assert refused.value.field == "forced_output_tokens"


@pytest.mark.parametrize("field", ["xtc_threshold", "xtc_probability"])
def test_xtc_ranges(engine, field):
    with pytest.raises(RequestRejected) as refused:
        engine.prepare(request(PROMPT, max_tokens=3, **{field: 1.5}))
    assert refused.value.field == field


def test_xtc_never_picks_a_top_choice_it_must_exclude(engine, smol):
    threshold = 0.02
    run = generate(engine, PROMPT, max_tokens=12, temperature=1.0, seed=[3], xtc_threshold=threshold,
                   xtc_probability=1.0)
    tokens = run.finishes[0].token_ids
    prompt = smol.tokenizer(PROMPT).input_ids
    probs = model_logprobs(smol, prompt + tokens).exp()
    excluded_somewhere = False
    for step, token in enumerate(tokens):
        p = probs[len(prompt) - 1 + step]
        top = (p >= threshold).nonzero()[:, 0].tolist()
        if len(top) >= 2:
            spared = min(top, key=lambda t: float(p[t]))
            assert token not in set(top) - {spared}, f"step {step} picked an excluded top choice"
            excluded_somewhere = True
    assert excluded_somewhere
    again = generate(engine, PROMPT, max_tokens=12, temperature=1.0, seed=[3], xtc_threshold=threshold,
                     xtc_probability=1.0)
    assert again.finishes[0].token_ids == tokens
