"""SentencePiece-style decoding (Metaspace + byte fallback, as Llama/Mistral): a tiny tokenizer built here."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

from worker.decoding import IncrementalDetokenizer

SAY, HELLO, WORLD, BANG, SPACE = 3, 4, 5, 6, 7
EMOJI = [8, 9, 10, 11]  # the four UTF-8 bytes of 😀 as <0x..> byte-fallback tokens


@pytest.fixture(scope="module")
def tokenizer():
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "▁Say": SAY, "▁Hello": HELLO, "▁world": WORLD, "!": BANG, "▁": SPACE}
    for i, byte in enumerate("😀".encode()):
        vocab[f"<0x{byte:02X}>"] = EMOJI[i]
    model = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token="<unk>"))
    # the Llama decoder: ▁ -> space, bytes fused, and the first leading space of a decode stripped
    model.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=model, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


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
