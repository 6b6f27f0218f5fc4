"""Choosing tokens: greedy, seeded sampling independent of the batch, logprobs, row bookkeeping."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from common.protocol import Watermark
from tests.worker.decoding.helpers import spec
from worker.decoding import DecodingBatch
from worker.decoding.logit_stats import argmax

V = 50


def logits_for(key: int, step: int) -> torch.Tensor:
    """Logits that depend only on which request a row is and the step, as a model's would."""
    return torch.randn(V, generator=torch.Generator().manual_seed(key * 1000 + step)) * 2


def test_greedy_is_argmax():
    batch = DecodingBatch(V)
    batch.add(spec([1, 2], temperature=0.0, top_k=3, top_p=0.1))  # warpers do not apply to greedy rows
    logits = torch.randn(1, V)
    choice = batch.choose(batch.process(logits))
    assert choice.token_ids == [int(logits.argmax())]


def test_argmax_is_torchs_on_ties_nan_and_infinities():
    inf, nan = float("inf"), float("nan")
    rows = torch.tensor([[1.0, 3.0, 3.0, 2.0], [nan, 1.0, nan, 5.0], [-inf] * 4, [inf, 1.0, inf, nan],
                         [0.5, -inf, inf, inf], [-0.0, 0.0, -0.0, -1.0]])
    wide = torch.randn(5, 49152).round(decimals=1)  # many ties at the maximum
    for scores in (rows, wide, wide[1:3], wide[:, ::2], wide.t().contiguous().t()):
        picked = argmax(scores)
        assert picked.dtype == torch.long and picked.tolist() == scores.argmax(dim=-1).tolist()


def test_seeded_sampling_ignores_batch_composition():
    settings = dict(temperature=0.9, top_k=20, top_p=0.9, repetition_penalty=1.2, no_repeat_ngram_size=2)

    def alone(key, seed, steps=12):
        batch = DecodingBatch(V)
        batch.add(spec([key, 3], seed=seed, **settings))
        out = []
        for step in range(steps):
            token = batch.choose(batch.process(logits_for(key, step)[None])).token_ids[0]
            batch.append([token])
            out.append(token)
        return out

    expected = {key: alone(key, seed=key + 40) for key in (1, 2, 3, 4)}
    # the same requests in one batch that changes under them: joins, leaves, reorders
    batch = DecodingBatch(V)
    keys: list[int] = []
    got: dict[int, list[int]] = {k: [] for k in expected}
    steps_done: dict[int, int] = {}

    def join(key):
        batch.add(spec([key, 3], seed=key + 40, **settings))
        keys.append(key)
        steps_done[key] = 0

    join(1)
    join(2)
    step = 0
    while keys:
        step += 1
        if step == 3:
            join(3)
        if step == 5:
            batch.reorder([2, 0, 1])
            keys[:] = [keys[i] for i in (2, 0, 1)]
        if step == 6:
            join(4)
        logits = torch.stack([logits_for(k, steps_done[k]) for k in keys])
        choice = batch.choose(batch.process(logits))
        batch.append(choice.tokens)
        for k, t in zip(keys, choice.token_ids):
            got[k].append(t)
            steps_done[k] += 1
        done = [i for i, k in enumerate(keys) if steps_done[k] == 12]
        if done:
            batch.filter([i for i in range(len(keys)) if i not in done])
            keys[:] = [k for i, k in enumerate(keys) if i not in done]
    assert got == expected


def test_sampling_follows_the_distribution():
    """Many rows with different seeds, one step: frequencies match softmax of the warped scores."""
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0] + [-30.0] * (V - 5))
    rows = 4000
    for settings, probs in (
        (dict(temperature=1.0), torch.softmax(logits, -1)[:5]),
        (dict(temperature=0.5), torch.softmax(logits / 0.5, -1)[:5]),
        (dict(top_k=2), torch.softmax(logits[:2], -1).tolist() + [0.0, 0.0, 0.0]),
    ):
        batch = DecodingBatch(V)
        for seed in range(rows):
            batch.add(spec([0], seed=seed, **settings))
        tokens = batch.choose(batch.process(logits.expand(rows, V))).tokens
        freq = torch.bincount(tokens, minlength=V)[:5].float() / rows
        assert torch.allclose(freq, torch.as_tensor(probs).float(), atol=0.03), (settings, freq)


def test_same_seed_same_tokens_and_reseed_forks():
    batch = DecodingBatch(V)
    batch.add(spec([1], seed=7, temperature=1.5))
    batch.reorder([0, 0, 0])  # three forks of one row share its generator state ...
    batch.reseed(2, 8)  # ... unless reseeded
    runs = []
    for step in range(10):
        choice = batch.choose(batch.process(logits_for(9, step).expand(3, V)))
        batch.append(choice.tokens)
        runs.append(choice.token_ids)
    first, second, third = zip(*runs)
    assert first == second and first != third


def test_logprobs_greedy_reports_model_distribution():
    logits = torch.randn(3, V)
    batch = DecodingBatch(V)
    batch.add(spec([1, 2], temperature=0.0, logprobs=3))
    batch.add(spec([1, 2], temperature=0.3, top_k=2, logprobs=0, seed=1))  # warped, but logprobs are not
    batch.add(spec([1, 2, 2], temperature=0.0, repetition_penalty=1.5, logprobs=2))
    choice = batch.choose(batch.process(logits))
    raw = torch.log_softmax(logits, -1)
    # no processor: the model's own logprobs (transformers' output_logits, log-softmaxed)
    assert abs(choice.logprobs[0] - float(raw[0].max())) < 1e-5
    top = torch.topk(raw[0], 3)
    assert [t for t, _ in choice.top_logprobs[0]] == top.indices.tolist()
    assert torch.allclose(torch.tensor([lp for _, lp in choice.top_logprobs[0]]), top.values, atol=1e-5)
    assert choice.top_logprobs[1] is None
    assert abs(choice.logprobs[1] - float(raw[1, choice.token_ids[1]])) < 1e-5
    # processors are included: transformers' output_scores for a greedy row
    processed = RepetitionPenaltyLogitsProcessor(1.5)(torch.tensor([[1, 2, 2]]), logits[2:3].clone())
    expected = torch.log_softmax(processed[0], -1)
    assert abs(choice.logprobs[2] - float(expected.max())) < 1e-5
    assert len(choice.top_logprobs[2]) == 2


def test_min_tokens_masks_eos_and_stop_ids():
    logits = torch.zeros(2, V)
    logits[:, 0] = 50.0  # EOS
    logits[:, 1] = 40.0  # a stop token id
    batch = DecodingBatch(V)
    batch.add(spec([5, 6, 7], eos=[0], temperature=0.0, min_tokens=2, stop_token_ids=[1]))
    batch.add(spec([5, 6, 7], eos=[0], temperature=0.0, min_total_tokens=6, stop_token_ids=[1]))
    seen = []
    for _ in range(4):
        choice = batch.choose(batch.process(logits))
        batch.append(choice.tokens)
        seen.append(choice.token_ids)
    assert [s[0] for s in seen] == [2, 2, 0, 0]  # min 2 new tokens
    assert [s[1] for s in seen] == [2, 2, 2, 0]  # min 6 total with a 3-token prompt


def test_process_leaves_logits_alone_and_checks_shape():
    batch = DecodingBatch(V)
    batch.add(spec([1, 2], repetition_penalty=2.0, temperature=0.5, logit_bias={3: 1.0}))
    logits = torch.randn(1, V)
    before = logits.clone()
    batch.process(logits)
    assert torch.equal(logits, before)
    try:
        batch.process(torch.randn(2, V))
    except ValueError:
        pass
    else:
        raise AssertionError("shape mismatch accepted")


@pytest.mark.parametrize("settings", [
    {}, {"temperature": 0.7, "top_k": 5}, {"logit_bias": {3: 2.0}}, {"repetition_penalty": 1.5},
    {"encoder_repetition_penalty": 1.5}, {"presence_penalty": 0.5}, {"frequency_penalty": 0.5},
    {"no_repeat_ngram_size": 1}, {"encoder_no_repeat_ngram_size": 1}, {"bad_word_tokens": [[4]]},
    {"bad_word_tokens": [[2, 4]]}, {"min_tokens": 3, "eos": [5]}, {"watermark": Watermark(gamma=0.5, delta=2.0)},
])
def test_every_processor_leaves_the_logits_alone(settings):
    """A batch whose processors edit nothing reads the logits without copying them: each one that edits writes
    into a copy, beside a row that uses none."""
    batch = DecodingBatch(V)
    batch.add(spec([1, 2], temperature=0.0))
    batch.add(spec([1, 2, 4, 2], **settings))
    logits = torch.randn(2, V)
    before = logits.clone()
    for _ in range(3):
        choice = batch.choose(batch.process(logits))
        batch.append(choice.tokens)
        assert torch.equal(logits, before)
    assert choice.token_ids[0] == int(logits[0].argmax())
