"""SentencePiece-style decoding (Metaspace + byte fallback, as Llama/Mistral), on a tiny tokenizer built in
memory (sentencepiece_style.py)."""

from __future__ import annotations

import pytest

from tests.worker.decoding.sentencepiece_style import (
    BANG,
    EMOJI,
    HELLO,
    SAY,
    SPACE,
    WORLD,
    sentencepiece_style_tokenizer,
)
from worker.decoding import IncrementalDetokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return sentencepiece_style_tokenizer()


GENERATED = [HELLO, WORLD, SPACE, *EMOJI, BANG, 2, HELLO]


def test_prompt_context_keeps_the_first_space(tokenizer):
    prompt = [1, SAY]
    for k in range(1, len(GENERATED) + 1):
        ids = GENERATED[:k]
        detok = IncrementalDetokenizer(tokenizer, prompt)
        deltas = [detok.push(t) for t in ids]
        text = "".join(deltas) + detok.flush()
        # in context the completion of "Say" is " Hello ...": the space decode(ids) alone would strip
        full = tokenizer.decode(prompt + ids, skip_special_tokens=True)
        assert text == full[len(tokenizer.decode(prompt, skip_special_tokens=True)) :]
        assert text.startswith(" Hello")
        assert "\ufffd" not in "".join(deltas)


def test_without_prompt_matches_plain_decode(tokenizer):
    detok = IncrementalDetokenizer(tokenizer)
    deltas = [detok.push(t) for t in GENERATED]
    assert "".join(deltas) + detok.flush() == tokenizer.decode(GENERATED, skip_special_tokens=True)
    assert deltas[3:6] == ["", "", ""]  # the emoji's first three bytes are withheld
