"""The grammar vocabulary table built from the tokenizer's decoder, normalizer and pre-tokenizer alone is the one
xgrammar's `from_huggingface` builds from the whole serialized tokenizer: byte-level (SmolLM2), byte-fallback
(SentencePiece style) and a Metaspace prefix space; and a compile process builds the same table from what it is
sent."""

from __future__ import annotations

import pytest
import xgrammar
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from tests.worker.decoding.sentencepiece_style import sentencepiece_style_tokenizer
from worker.decoding.grammar.vocabulary import from_table, serialized_table, tokenizer_table


def metaspace_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "▁a": 3, "▁b": 4, "▁": 5, "a": 6, "b": 7}
    model = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    model.normalizer = normalizers.NFKC()
    model.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    model.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    return PreTrainedTokenizerFast(tokenizer_object=model, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def assert_same_table(tokenizer, vocab_size: int, stop_ids: list[int]) -> None:
    ours, table = tokenizer_table(tokenizer, vocab_size, stop_ids)
    theirs = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_ids)
    assert (ours.vocab_type, ours.add_prefix_space) == (theirs.vocab_type, theirs.add_prefix_space)
    assert ours.serialize_json() == theirs.serialize_json()
    # what a compile process builds from the table it is sent, either form
    assert from_table(table).serialize_json() == theirs.serialize_json()
    assert from_table(serialized_table(theirs)).serialize_json() == theirs.serialize_json()


def test_a_byte_level_vocabulary_gets_the_table_from_huggingface_builds(smol):
    assert_same_table(smol.tokenizer, smol.model.config.vocab_size, [smol.tokenizer.eos_token_id])


@pytest.mark.parametrize("build", [sentencepiece_style_tokenizer, metaspace_tokenizer])
def test_byte_fallback_and_prefix_space_vocabularies_get_the_same_table(build):
    tokenizer = build()
    assert_same_table(tokenizer, len(tokenizer.get_vocab()) + 3, [2])  # a model's vocabulary may be padded


def test_a_table_without_stop_ids_is_refused_as_from_huggingface_refuses_it():
    with pytest.raises(ValueError, match="stop_token_ids cannot be empty"):
        tokenizer_table(sentencepiece_style_tokenizer(), 12, [])
