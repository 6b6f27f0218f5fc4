"""Incremental detokenization on the real SmolLM2 tokenizer is exact for every prefix."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from worker.decoding import IncrementalDetokenizer

TEXTS = [
    "Hello world",
    " leading and trailing spaces  ",
    "emoji 😀👍🏽 family 👨‍👩‍👧 flags 🇫🇷🇯🇵",
    "日本語のテキストと中文混合",
    "accents: café naïve façade Ærøskøbing ñandú",
    "lines\n\nwith\ttabs\n  indented\n",
    "code: def f(x):\n    return x ** 2  # 🚀",
    "mixed 한국어, Ελληνικά, русский, العربية ✓",
]


def stream(tokenizer, ids, prompt_ids=None, skip_special_tokens=True):
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, skip_special_tokens=skip_special_tokens)
    deltas = [detok.push(t) for t in ids]
    return deltas, detok.flush()


def check_every_prefix(tokenizer, ids, prompt_ids=None, skip_special_tokens=True):
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, skip_special_tokens=skip_special_tokens)
    emitted = ""
    for k, token in enumerate(ids, start=1):
        emitted += detok.push(token)
        full = tokenizer.decode(ids[:k], skip_special_tokens=skip_special_tokens)
        assert full.startswith(emitted), (emitted, full)  # never emits text it must take back
        # what a fresh stream of this prefix gives, flushed, is exactly the decode of the prefix
        deltas, rest = stream(tokenizer, ids[:k], prompt_ids, skip_special_tokens)
        assert "".join(deltas) + rest == full
        if "\ufffd" not in full:
            assert "\ufffd" not in emitted
    assert emitted + detok.flush() == tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


@pytest.mark.parametrize("text", TEXTS)
def test_exact_for_every_prefix(smollm2_tokenizer, text):
    ids = smollm2_tokenizer(text, add_special_tokens=False)["input_ids"]
    check_every_prefix(smollm2_tokenizer, ids)


@pytest.mark.parametrize("text", TEXTS)
def test_prompt_context_keeps_leading_space(smollm2_tokenizer, text):
    tok = smollm2_tokenizer
    prompt = tok("Question: say it 😀", add_special_tokens=False)["input_ids"]
    ids = tok(" " + text, add_special_tokens=False)["input_ids"]
    deltas, rest = stream(tok, ids, prompt)
    assert "".join(deltas) + rest == tok.decode(ids)
    assert next(d for d in deltas if d).startswith(" ")


def test_no_replacement_char_for_split_emoji(smollm2_tokenizer):
    tok = smollm2_tokenizer
    ids = tok("😀", add_special_tokens=False)["input_ids"]
    assert len(ids) > 1  # the emoji really is split across byte tokens
    deltas, rest = stream(tok, ids)
    assert deltas[:-1] == [""] * (len(ids) - 1) and deltas[-1] == "😀" and rest == ""


@pytest.mark.parametrize("skip", [True, False])
def test_special_tokens(smollm2_tokenizer, skip):
    tok = smollm2_tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    chat = tok(text, add_special_tokens=False)["input_ids"]
    assert chat[-4] in tok.all_special_ids  # the prompt ends in "<|im_start|>assistant\n"
    ids = tok("Hello there 👋", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    deltas, rest = stream(tok, ids, chat, skip_special_tokens=skip)
    assert "".join(deltas) + rest == tok.decode(ids, skip_special_tokens=skip)
    check_every_prefix(tok, ids, chat, skip_special_tokens=skip)


def test_incomplete_character_is_flushed_as_in_full_decode(smollm2_tokenizer):
    tok = smollm2_tokenizer
    ids = tok("ok 😀", add_special_tokens=False)["input_ids"][:-1]  # cut inside the emoji
    deltas, rest = stream(tok, ids)
    assert "".join(deltas) + rest == tok.decode(ids)
    assert "\ufffd" not in "".join(deltas)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=st.sampled_from(list("ab \n\té日本😀👍🏽ñ.")), max_size=25))
def test_random_texts(smollm2_tokenizer, text):
    ids = smollm2_tokenizer(text, add_special_tokens=False)["input_ids"]
    deltas, rest = stream(smollm2_tokenizer, ids)
    assert "".join(deltas) + rest == smollm2_tokenizer.decode(ids)
