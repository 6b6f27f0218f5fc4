"""Hypothesis properties on random token streams: penalties, n-gram bans, bad words, stop strings."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.worker.decoding.helpers import first_stop, spec
from worker.decoding import DecodingBatch, StopMatcher

V = 30
tokens = st.lists(st.integers(0, V - 1), min_size=1, max_size=10)
small_tokens = st.lists(st.integers(0, 5), min_size=1, max_size=10)


@settings(max_examples=60, deadline=None)
@given(
    prompt=tokens,
    output=st.lists(st.integers(0, V - 1), max_size=12),
    presence=st.floats(-2, 2),
    frequency=st.floats(-2, 2),
    repetition=st.floats(0.5, 2.0),
    seed=st.integers(0, 2**16),
)
def test_penalties_match_their_definitions(prompt, output, presence, frequency, repetition, seed):
    batch = DecodingBatch(V)
    batch.add(spec(prompt, presence_penalty=presence, frequency_penalty=frequency, repetition_penalty=repetition))
    batch.add(spec(prompt))  # a neutral neighbour is left alone
    for t in output:
        batch.append([t, t])
    logits = torch.randn(2, V, generator=torch.Generator().manual_seed(seed)) * 4
    got = batch.process(logits)

    expected = logits[0].clone()
    for t in set(prompt) | set(output):  # HF repetition penalty: prompt + output, once per token
        x = expected[t]
        expected[t] = x * repetition if x < 0 else x / repetition
    for t in set(output):  # OpenAI: output only
        expected[t] -= frequency * output.count(t) + presence
    torch.testing.assert_close(got[0], expected, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(got[1], logits[1])


def _generate(specs, steps, seed, vocab=V):
    batch = DecodingBatch(vocab)
    for s in specs:
        batch.add(s)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        choice = batch.choose(batch.process(torch.randn(len(specs), vocab, generator=gen)))
        batch.append(choice.tokens)
    return batch


def _ngrams(seq, n):
    return [tuple(seq[i : i + n]) for i in range(len(seq) - n + 1)]


@settings(max_examples=40, deadline=None)
@given(prompt=small_tokens, n=st.integers(1, 4), steps=st.integers(1, 12), seed=st.integers(0, 2**16))
def test_no_repeat_ngram_never_repeats(prompt, n, steps, seed):
    # sampling and greedy rows; with V > len(prompt) + steps some token is always allowed
    specs = [spec(prompt, no_repeat_ngram_size=n, temperature=t, seed=seed) for t in (0.0, 1.0, 2.0)]
    batch = _generate(specs, steps, seed)
    for i in range(len(specs)):
        history = batch.history(i)
        for end in range(max(len(prompt), n - 1) + 1, len(history) + 1):
            gram = tuple(history[end - n : end])
            assert gram not in _ngrams(history[: end - 1], n), (history, n)


@settings(max_examples=40, deadline=None)
@given(prompt=small_tokens, n=st.integers(1, 3), steps=st.integers(1, 12), seed=st.integers(0, 2**16))
def test_encoder_no_repeat_ngram_never_copies_the_prompt(prompt, n, steps, seed):
    specs = [spec(prompt, encoder_no_repeat_ngram_size=n, temperature=t, seed=seed) for t in (0.0, 1.5)]
    batch = _generate(specs, steps, seed, vocab=12)
    prompt_grams = set(_ngrams(prompt, n))
    for i in range(len(specs)):
        history = batch.history(i)
        for end in range(max(len(prompt), n - 1) + 1, len(history) + 1):
            assert tuple(history[end - n : end]) not in prompt_grams


@settings(max_examples=40, deadline=None)
@given(
    prompt=small_tokens,
    phrases=st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=3), min_size=1, max_size=4),
    steps=st.integers(1, 12),
    seed=st.integers(0, 2**16),
)
def test_bad_words_never_completed(prompt, phrases, steps, seed):
    # tokens 0..5 get a strong bias so the model keeps walking into the bad phrases
    bias = {t: 4.0 for t in range(6)}
    specs = [
        spec(prompt, bad_word_tokens=phrases, logit_bias=bias, temperature=t, seed=seed) for t in (0.0, 1.0)
    ] + [spec(prompt, bad_word_ids=phrases, logit_bias=bias, temperature=1.0, seed=seed + 1)]
    batch = _generate(specs, steps, seed)
    for i in range(len(specs)):
        history = batch.history(i)
        for end in range(len(prompt) + 1, len(history) + 1):
            for phrase in phrases:
                assert history[max(0, end - len(phrase)) : end] != phrase, (history, phrase)


alphabet = st.text(alphabet="ab \n😀", max_size=40)


@settings(max_examples=300, deadline=None)
@given(text=alphabet, stops=st.lists(st.text(alphabet="ab \n😀", min_size=1, max_size=4), max_size=3), data=st.data())
def test_stop_matcher_any_chunking(text, stops, data):
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=10)))
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    matcher = StopMatcher(stops)
    expected_text, expected_stop = first_stop(text, stops)
    out, matched = "", None
    for chunk in chunks:
        emitted, matched = matcher.push(chunk)
        out += emitted
        assert expected_text.startswith(out)  # never leaks text that a stop will swallow
        if matched:
            break
    if matched is None:
        out += matcher.flush()
    assert (out, matched) == (expected_text, expected_stop)
    if len(stops) == 1:
        assert out == text.split(stops[0])[0]
