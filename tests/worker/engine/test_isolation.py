"""One request that fails inside a decode step fails alone: it gets its own Error event and leaves the
batch, and every other request finishes exactly as it does alone (row_faults.py, engine.py).

The failures are real ones, through real requests on a tiny random Llama built here: a request that
bans every token, and a model whose weights turn one prompt token into NaN (as an overflowing layer
would). The vectorized processing's fallback, one row at a time, is checked on a real DecodingBatch
with a row whose processing raises.
"""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch

from common.protocol import Error, ModelConfig
from tests.worker.beam.tiny import WORDS, tiny_model
from tests.worker.decoding.helpers import spec
from tests.worker.engine.runs import request, running_engine, submit
from worker.decoding import DecodingBatch
from worker.engine.engine import Engine
from worker.engine.row_faults import choose_isolating

SUN = WORDS.index("sun")
# the requests that must not notice: greedy, seeded sampling with two choices, and a beam search; none
# of them may produce "sun", which the poisoned model below turns into NaN
OTHERS = [dict(prompt_ids=[1, 2, 3], max_tokens=12, temperature=0.0),
          dict(prompt_ids=[1, 5, 6, 2], max_tokens=10, temperature=1.0, seed=[11], n=2),
          dict(prompt_ids=[1, 4], max_tokens=8, num_beams=2, n=2),
          dict(prompt_ids=[1, 6], max_tokens=14, temperature=0.7, seed=[5], top_k=4)]


# "sun" at position 6: its NaN keys and values sit past the short prompts of the others, where a row later
# moved into this slot reads them through its masked positions
POISONED_PROMPT = [1, 2, 3, 4, 5, 2, SUN, 3, 4, 3, 4]


def _others():
    return [request(**params, ignore_eos=True, bad_word_tokens=[[SUN]]) for params in OTHERS]


def _outputs(run) -> list[list[int]]:
    assert not run.of(Error), run.of(Error)
    return [finish.token_ids for finish in run.finishes]


def _alone(loaded) -> list[list[list[int]]]:
    with running_engine(loaded, "isolation-alone", max_batch_size=16, max_context=64) as engine:
        return [_outputs(submit(engine, r).wait(120)) for r in _others()]


def _beside(loaded, failing):
    """The failing request first (slot 0), every other one queued before the engine starts: they are
    prefilled together and share every decode step, unequal lengths and all."""
    engine = Engine(loaded, ModelConfig(max_batch_size=16, max_context=64), "isolation")
    bad = submit(engine, failing)
    together = [submit(engine, r) for r in _others()]
    engine.start()
    try:
        return bad.wait(120), [_outputs(run.wait(120)) for run in together], engine.load()
    finally:
        engine.stop()


@pytest.fixture(scope="module")
def tiny():
    return tiny_model()


def test_a_request_that_bans_every_token_fails_alone(tiny):
    failing = request(prompt_ids=[1, 2, 2, 3], max_tokens=6, ignore_eos=True,
                      bad_word_tokens=[[token] for token in range(len(WORDS))])
    bad, beside, load = _beside(tiny, failing)
    assert beside == _alone(tiny)
    errors = bad.of(Error)
    assert len(errors) == 1 and errors[0].kind == "internal" and "every token was ruled out" in errors[0].message
    assert load.running_rows == 0 and load.queued == 0


@pytest.fixture(scope="module")
def poisoned(tiny):
    """The tiny model with a NaN embedding for "sun": any row fed "sun" computes NaN from there on."""
    model = copy.deepcopy(tiny.model)
    with torch.no_grad():
        model.model.embed_tokens.weight[SUN] = math.nan
    return dataclasses.replace(tiny, model=model)


def test_a_request_whose_scores_turn_nan_fails_alone_and_leaves_no_nan_behind(poisoned):
    """Its slot of the KV cache holds NaN keys and values. The next row moved into that slot attends over
    the positions past its own length masked, and masked NaN is still NaN (0 x NaN): the slot is cleared
    when the request fails."""
    failing = request(prompt_ids=POISONED_PROMPT, max_tokens=6, temperature=0.0, logprobs=2)
    bad, beside, _ = _beside(poisoned, failing)
    assert beside == _alone(poisoned)
    errors = bad.of(Error)
    assert len(errors) == 1 and "not finite" in errors[0].message


def test_a_nan_prompt_logprob_fails_the_request_in_its_prefill_alone(poisoned):
    failing = request(prompt_ids=POISONED_PROMPT, max_tokens=4, temperature=0.0, prompt_logprobs=True)
    bad, beside, _ = _beside(poisoned, failing)
    assert beside == _alone(poisoned)
    errors = bad.of(Error)
    assert len(errors) == 1 and "prefilling" in errors[0].message


def test_a_row_whose_processing_raises_is_set_apart_and_the_group_chooses_as_before():
    """Vectorized processing cannot say which row raised: the group is processed again row by row, from
    the generator states it had, and only the failing row is set apart."""
    vocab = 12
    rows = [spec([1, 2], seed=3, temperature=1.0), spec([4], temperature=0.0, repetition_penalty=1.3),
            spec([5, 6], seed=9, temperature=0.8, top_k=5)]
    broken = spec([7], seed=1, temperature=1.0, logit_bias={vocab + 3: 1.0})  # an index past the scores
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(0))

    clean = DecodingBatch(vocab)
    for row in rows:
        clean.add(row)
    _, expected, faults = choose_isolating(clean, logits[[0, 1, 3]])
    assert faults == {}

    mixed = DecodingBatch(vocab)
    for row in rows[:2] + [broken] + rows[2:]:
        mixed.add(row)
    _, choice, faults = choose_isolating(mixed, logits[[0, 1, 2, 3]])
    assert list(faults) == [2] and "IndexError" in faults[2]
    kept = [0, 1, 3]
    assert [choice.token_ids[i] for i in kept] == expected.token_ids
    assert [choice.logprobs[i] for i in kept] == pytest.approx(expected.logprobs)
