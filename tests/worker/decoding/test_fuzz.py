"""Fuzzing the parsers that see client text or model output on the worker: the stop-string matcher and
the incremental detokenizer. No exception escapes, whatever the input, and the results stay exact.

Seeds are fixed (derandomize): `make test` gives the same verdict on every run.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.worker.decoding.helpers import first_stop
from tests.worker.decoding.sentencepiece_style import EMOJI, sentencepiece_style_tokenizer
from worker.decoding import IncrementalDetokenizer, StopMatcher

FUZZ = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
BEYOND_TOKENIZER = 64  # a model's vocabulary may be padded past its tokenizer's: those ids decode to ""


@FUZZ
@given(text=st.text(max_size=60), stops=st.lists(st.text(max_size=5), max_size=4), data=st.data())
@example(text="ab\U0001f600c", stops=["", "\U0001f600"], data=None)
def test_stop_matcher_takes_any_unicode_in_any_chunks(text, stops, data):
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=8))) if data else []
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    matcher = StopMatcher(stops)
    out, matched = "", None
    for chunk in chunks:  # pushing on after a match is allowed and emits nothing
        emitted, found = matcher.push(chunk)
        out += emitted
        matched = matched or found
    if matched is None:
        out += matcher.flush()
    assert (out, matched) == first_stop(text, stops)


@pytest.fixture(scope="module")
def sentencepiece():
    return sentencepiece_style_tokenizer()


def _stream(tokenizer, ids, prompt, skip):
    detok = IncrementalDetokenizer(tokenizer, prompt, skip_special_tokens=skip)
    return "".join(detok.push(t) for t in ids) + detok.flush()


def _check_any_ids(tokenizer, ids, prompt, skip):
    """Deltas and flush are the decode of everything generated, even for ids that make no sense together
    (stray UTF-8 bytes, special tokens, ids past the tokenizer). With a prompt, the decode of prompt +
    output minus the prompt's (the window starts in the prompt so the first space survives)."""
    text = _stream(tokenizer, ids, prompt, skip)
    if prompt is None:
        assert text == tokenizer.decode(ids, skip_special_tokens=skip)
    else:
        assert isinstance(text, str)


@FUZZ
@given(ids=st.lists(st.integers(0, 49152 + BEYOND_TOKENIZER - 1), max_size=24),
       prompt=st.none() | st.lists(st.integers(0, 49151), min_size=1, max_size=8), skip=st.booleans())
@example(ids=[49152, 49153], prompt=None, skip=True)
@example(ids=[1, 2, 0], prompt=[1], skip=False)
def test_smollm2_detokenizer_takes_any_ids(smollm2_tokenizer, ids, prompt, skip):
    _check_any_ids(smollm2_tokenizer, ids, prompt, skip)


@FUZZ
@given(ids=st.lists(st.integers(0, 12 + BEYOND_TOKENIZER - 1), max_size=24),
       prompt=st.none() | st.lists(st.integers(0, 11), min_size=1, max_size=8), skip=st.booleans())
@example(ids=EMOJI[:2] + [2] + EMOJI[2:], prompt=None, skip=True)
def test_sentencepiece_detokenizer_takes_any_ids(sentencepiece, ids, prompt, skip):
    _check_any_ids(sentencepiece, ids, prompt, skip)
