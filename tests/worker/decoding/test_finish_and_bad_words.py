"""Finish decisions on token ids, and bad-word tokenization with the real SmolLM2 tokenizer."""

from __future__ import annotations

import torch

from tests.worker.decoding.helpers import spec
from worker.decoding import DecodingBatch, finish_reason, tokenize_bad_words


def test_finish_reasons():
    row = spec([1, 2, 3], eos=[0, 9], stop_token_ids=[5], max_tokens=4)
    assert finish_reason(row, 0, 1) == ("eos_token", None)
    assert finish_reason(row, 9, 1) == ("eos_token", None)
    assert finish_reason(row, 5, 1) == ("stop_token", 5)
    assert finish_reason(row, 7, 3) is None
    assert finish_reason(row, 7, 4) == ("length", None)
    assert finish_reason(row, 0, 4) == ("eos_token", None)  # the end token wins on the last step
    total = spec([1, 2, 3], max_total_tokens=5)
    assert finish_reason(total, 7, 1) is None and finish_reason(total, 7, 2) == ("length", None)
    assert finish_reason(spec([1, 2, 3]), 7, 2, max_context=5) == ("length", None)
    ignoring = spec([1], eos=[], ignore_eos=True)  # the engine leaves EOS out of eos_token_ids
    assert finish_reason(ignoring, 0, 1) is None


def test_tokenize_bad_words_adds_leading_space_variant(smollm2_tokenizer):
    tok = smollm2_tokenizer
    ids = tokenize_bad_words(tok, ["Paris", " New York", ""])
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    assert ids == [enc("Paris"), enc(" Paris"), enc(" New York")]
    assert len(enc(" New York")) == 2


def test_bad_word_is_banned_mid_sentence(smollm2_tokenizer):
    tok = smollm2_tokenizer
    prompt = tok("The capital of France is", add_special_tokens=False)["input_ids"]
    paris = tok(" Paris", add_special_tokens=False)["input_ids"][0]
    logits = torch.zeros(1, len(tok))
    logits[0, paris] = 10.0
    batch = DecodingBatch(len(tok))
    batch.add(spec(prompt, temperature=0.0, bad_word_ids=tokenize_bad_words(tok, ["Paris"])))
    scores = batch.process(logits)
    assert scores[0, paris] == -float("inf")
    assert batch.choose(scores).token_ids[0] != paris
