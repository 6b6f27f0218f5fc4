"""DETERMINISTIC beam search equals transformers `generate(num_beams=k, do_sample=False)` token for
token on the real SmolLM2 weights, alone and while sharing the batch with other requests.

Without logits processors our default normalisation is transformers'; with processors the request
sets both compat flags (log-softmax before the processors, no second normalisation), which is
transformers' order of operations (README_beam.md).
"""

from __future__ import annotations

import msgspec
import pytest

from tests.worker.beam.helpers import beam_reference, request, run_all

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "The three primary colors are",
    "Water boils at",
    "My favourite recipe for pancakes",
    "In 1969, astronauts",
    "The quick brown fox",
    "To be or not to be,",
    "A haiku about autumn:",
    "The best way to learn a language is",
    "import numpy as np\n",
    "Dear customer, we are sorry",
    "The mitochondria is",
    "List of planets: Mercury, Venus,",
    "Q: What is 2 + 2?\nA:",
    "The weather today is",
    "SELECT name FROM",
    "Photosynthesis converts",
    "Breaking news:",
    "The meaning of life",
    "Translate to French: cheese",
    "Rust and Python differ in",
    "Step 1: preheat the oven",
]

COMPAT = {"beam_compat_pre_normalization": True, "beam_compat_no_post_normalization": True}

# (name, request parameters); each runs on its own slice of the prompts
GRID = [
    ("plain", dict(num_beams=4, max_tokens=12)),
    ("early_true", dict(num_beams=3, n=3, max_tokens=10, length_penalty=0.5, early_stopping=True)),
    ("never_long", dict(num_beams=4, n=2, max_tokens=10, length_penalty=2.0, early_stopping="never")),
    ("short_bias", dict(num_beams=2, n=2, max_tokens=12, length_penalty=-1.0)),
    ("canonical", dict(num_beams=4, n=4, max_tokens=8, length_penalty=0.0, early_stopping="never")),
    ("min_tokens", dict(num_beams=4, n=2, max_tokens=10, min_tokens=6, **COMPAT)),
    ("ngrams", dict(num_beams=3, max_tokens=14, no_repeat_ngram_size=2, **COMPAT)),
    ("repetition", dict(num_beams=4, n=2, max_tokens=12, repetition_penalty=1.3, **COMPAT)),
    ("bad_words", dict(num_beams=4, max_tokens=12, bad_word_tokens=[[13], [30], [28, 339]], **COMPAT)),
    ("stop_token", dict(num_beams=3, n=2, max_tokens=12, stop_token_ids=[30, 28], early_stopping=True)),
]


def prompt_ids(tokenizer, index: int) -> list[int]:
    return tokenizer(PROMPTS[index % len(PROMPTS)]).input_ids


def check(collector, expected: tuple[list[list[int]], list[float]], params: dict) -> None:
    sequences, scores = expected
    finishes = sorted(collector.finishes, key=lambda f: f.index)
    assert [f.token_ids for f in finishes] == sequences
    for finish, score in zip(finishes, scores):
        assert finish.score == pytest.approx(score, abs=1e-3)
        length = len(finish.token_ids)
        assert finish.cumulative_logprob == pytest.approx(score * length ** params.get("length_penalty", 1.0),
                                                          abs=1e-2)
    assert collector.done.completion_tokens == sum(len(s) for s in sequences)
    assert collector.done.compute_tokens % params["num_beams"] == 0
    assert collector.done.compute_tokens >= params["num_beams"] * max(len(s) for s in sequences)
    assert all(not hasattr(e, "token_id") for e in collector.events), "beam requests stream no tokens"


@pytest.mark.parametrize("name,params", GRID, ids=[g[0] for g in GRID])
def test_alone(beam_engine, smol, name, params):
    index = GRID.index((name, params))
    ids = prompt_ids(smol.tokenizer, index)
    [collector] = run_all(beam_engine, [request(ids, **params)])
    check(collector, beam_reference(smol.model, ids, params, beam_engine.model_eos), params)


def test_sharing_the_batch(beam_engine, smol):
    """Two beam requests of every kind (twenty prompts not used above) and greedy and seeded sampled
    rows, all submitted at once: more rows than the batch holds, so requests also join and leave
    while beams run. Every beam result still equals transformers, and the ordinary rows give
    exactly what they give alone."""
    tokenizer = smol.tokenizer
    beams = [(prompt_ids(tokenizer, len(GRID) + 2 * i + j), params) for i, (_, params) in enumerate(GRID)
             for j in range(2)]
    ordinary = [request(prompt_ids(tokenizer, 1), max_tokens=20, temperature=0.0),
                request(prompt_ids(tokenizer, 2), max_tokens=20, temperature=0.9, seed=[11]),
                request(prompt_ids(tokenizer, 3), max_tokens=6, temperature=1.1, top_k=40, seed=[7])]
    results = run_all(beam_engine, [request(ids, **params) for ids, params in beams] + ordinary)
    for (ids, params), collector in zip(beams, results):
        check(collector, beam_reference(smol.model, ids, params, beam_engine.model_eos), params)
    alone = run_all(beam_engine, [request(r.prompt_ids, **msgspec.structs.asdict(r.params)) for r in ordinary])
    for shared, single in zip(results[len(beams):], alone):
        assert [f.token_ids for f in shared.finishes] == [f.token_ids for f in single.finishes]
    budget = beam_engine.beam_budget  # beam rows sat out some of the steps they shared with ordinary rows
    assert budget.ordinary_s is not None and budget.full_s is not None
