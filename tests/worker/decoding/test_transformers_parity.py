"""Our batched pipeline equals transformers' processors run on each row alone.

Each test builds a batch whose rows have different settings (and a neutral row), runs several steps
with random logits and random appended tokens, and compares every row with transformers.
"""

from __future__ import annotations

import pytest
import torch

from tests.worker.decoding.helpers import hf_scores, spec
from worker.decoding import DecodingBatch

V = 64


def run_parity(specs, steps: int = 6, seed: int = 0, vocab: int = V) -> None:
    gen = torch.Generator().manual_seed(seed)
    batch = DecodingBatch(vocab)
    for s in specs:
        batch.add(s)
    for _ in range(steps):
        logits = torch.randn(len(specs), vocab, generator=gen) * 3
        ours = batch.process(logits)
        for i, s in enumerate(specs):
            ref = hf_scores(s, batch.history(i), logits[i])
            torch.testing.assert_close(ours[i], ref, atol=1e-5, rtol=0, msg=lambda m, i=i: f"row {i}: {m}")
        # small alphabet so repeats, n-grams and bad-word prefixes actually happen
        batch.append(torch.randint(0, 8, (len(specs),), generator=gen))


PROMPT = [1, 2, 3, 1, 2, 4, 5]


def test_temperature():
    run_parity([spec(PROMPT, temperature=t) for t in (0.5, 1.0, 1.7, 0.0)])


def test_top_k():
    run_parity([spec(PROMPT, top_k=k) for k in (1, 5, 0, 40, -1, 10_000)])


def test_top_p():
    run_parity([spec(PROMPT, top_p=p) for p in (0.1, 0.5, 0.95, 1.0)])


def test_min_p():
    run_parity([spec(PROMPT, min_p=p) for p in (0.05, 0.3, 0.0, 0.9)])


def test_typical_p():
    run_parity([spec(PROMPT, typical_p=p) for p in (0.2, 0.5, 0.9, 1.0)])


def test_repetition_penalty():
    run_parity([spec(PROMPT, repetition_penalty=p) for p in (1.3, 0.7, 1.0, 2.0)])


def test_encoder_repetition_penalty():
    run_parity([spec(PROMPT, encoder_repetition_penalty=p) for p in (1.3, 0.7, 1.0, 2.0)])


def test_no_repeat_ngram():
    run_parity([spec(PROMPT, no_repeat_ngram_size=n) for n in (1, 2, 3, 0)], steps=10)


def test_encoder_no_repeat_ngram():
    run_parity([spec(PROMPT, encoder_no_repeat_ngram_size=n) for n in (1, 2, 3, 0)], steps=10)


def test_bad_words_ids():
    run_parity(
        [
            spec(PROMPT, bad_word_tokens=[[3], [1, 2], [2, 4, 5]]),
            spec(PROMPT, bad_word_ids=[[0, 1], [4]], eos=[9]),
            spec(PROMPT, bad_word_tokens=[[9]], eos=[9]),  # a lone EOS is not a bad word (transformers)
            spec(PROMPT),
        ],
        steps=10,
    )


def test_min_new_tokens():
    run_parity([spec(PROMPT, min_tokens=m, eos=e) for m, e in ((3, [0]), (1, [0, 5]), (0, [0]), (10, [7]))])


def test_sequence_bias_is_logit_bias():
    run_parity([spec(PROMPT, logit_bias=b) for b in ({3: 2.5, 7: -1.0}, {}, {0: -100.0, 63: 5.0})])


def test_suppress_tokens_are_single_token_bans():
    run_parity([spec(PROMPT, bad_word_tokens=[[t] for t in ts]) for ts in ((0, 5, 63), (), (7,))])


@pytest.mark.parametrize("seed", range(5))
def test_everything_at_once(seed):
    """Rows with random mixes of every setting, all in one batch."""
    rng = torch.Generator().manual_seed(100 + seed)

    def pick(options):
        return options[int(torch.randint(len(options), (1,), generator=rng))]

    specs = []
    for _ in range(6):
        specs.append(
            spec(
                PROMPT[: pick([1, 3, 7])],
                eos=pick([[], [0], [0, 6]]),
                temperature=pick([0.0, 0.6, 1.0, 1.5]),
                top_k=pick([0, 3, 20]),
                top_p=pick([1.0, 0.8, 0.3]),
                min_p=pick([0.0, 0.1]),
                typical_p=pick([1.0, 0.7]),
                repetition_penalty=pick([1.0, 1.2, 0.8]),
                encoder_repetition_penalty=pick([1.0, 1.5]),
                no_repeat_ngram_size=pick([0, 2, 3]),
                encoder_no_repeat_ngram_size=pick([0, 2]),
                bad_word_tokens=pick([[], [[2]], [[1, 2], [5]]]),
                logit_bias=pick([{}, {4: 1.5}]),
                min_tokens=pick([0, 2]),
            )
        )
    run_parity(specs, steps=8, seed=seed)


def test_parity_survives_add_filter_reorder():
    """Per-row state follows its row when rows join, leave, move and get duplicated."""
    gen = torch.Generator().manual_seed(7)
    specs = [
        spec(PROMPT, repetition_penalty=1.4, no_repeat_ngram_size=2),
        spec(PROMPT[:3], encoder_repetition_penalty=1.6, bad_word_tokens=[[1, 2]]),
        spec(PROMPT, temperature=0.7, top_k=5, min_tokens=4, eos=[0]),
        spec(PROMPT[:5], encoder_no_repeat_ngram_size=2, logit_bias={3: 1.0}),
    ]
    batch = DecodingBatch(V)
    for s in specs:
        batch.add(s)

    def step():
        logits = torch.randn(len(specs), V, generator=gen) * 3
        ours = batch.process(logits)
        for i, s in enumerate(specs):
            torch.testing.assert_close(ours[i], hf_scores(s, batch.history(i), logits[i]), atol=1e-5, rtol=0)
        batch.append(torch.randint(0, 8, (len(specs),), generator=gen))

    for _ in range(3):
        step()
    batch.filter([0, 2, 3])
    specs = [specs[i] for i in (0, 2, 3)]
    step()
    batch.add(spec(PROMPT, repetition_penalty=0.5, top_p=0.5))
    specs.append(batch.rows[-1].spec)
    step()
    order = [3, 0, 0, 2, 1]
    batch.reorder(order)
    specs = [specs[i] for i in order]
    for _ in range(3):
        step()


def test_top_p_on_a_large_vocabulary():
    """Peaked rows take the candidate shortcut, flat rows the full sort; both equal transformers."""
    gen = torch.Generator().manual_seed(3)
    vocab = 3000
    specs = [spec(PROMPT, top_p=p, temperature=t) for p, t in ((0.9, 1.0), (0.5, 0.2), (0.99, 3.0), (0.3, 1.0))]
    batch = DecodingBatch(vocab)
    for s in specs:
        batch.add(s)
    for scale in (0.1, 1.0, 8.0):  # flat to peaked
        logits = torch.randn(len(specs), vocab, generator=gen) * scale
        ours = batch.process(logits)
        for i, s in enumerate(specs):
            torch.testing.assert_close(ours[i], hf_scores(s, batch.history(i), logits[i]), atol=1e-5, rtol=0)
