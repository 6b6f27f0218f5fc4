"""xgrammar's table of a tokenizer's vocabulary (`TokenizerInfo`), and the form it travels in to the compile processes.

xgrammar's `from_huggingface` reads three settings of a fast tokenizer (byte-fallback or byte-level tokens, a
prefix space) from its decoder, normalizer and pre-tokenizer, but finds them by serializing the whole Rust
tokenizer (`to_str()`: vocabulary and merges) and parsing that in C++. Here the same C++ detection reads a JSON
object of those three components alone; the rest is `from_huggingface`'s path for fast tokenizers, step for step
(tests/worker/grammar/test_vocabulary.py compares the two). Anything else (a slow or tiktoken tokenizer) goes to
`from_huggingface` itself.

The compile processes get the table as the token strings and xgrammar's metadata (`from_vocab_and_metadata`), not
as xgrammar's `serialize_json`, whose C++ builds a JSON tree of every decoded token, sorted copy and trie index
first. Gemma 3 (262,144 tokens, 514,906 merges), measured in one process: `from_huggingface` then `serialize_json`
peaked ~216 and ~135 MB above what they kept, this ~45 MB; the table it sends is 3.6 MB of UTF-8 (the JSON was a
9.6 M-character str, four bytes a character with any non-Latin token in it).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from transformers import PreTrainedTokenizerFast

if TYPE_CHECKING:  # imported where used: a worker that serves no structured output never loads it (~21 MB)
    import xgrammar as xgr

DETECTED_FROM = ("decoder", "normalizer", "pre_tokenizer")  # what xgrammar's detection reads of tokenizer.json


def tokenizer_table(tokenizer, vocab_size: int, stop_ids: list[int]) -> tuple[xgr.TokenizerInfo, bytes]:
    """xgrammar's table of the vocabulary, and what `from_table` builds the same table from in another process."""
    import xgrammar as xgr

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if not isinstance(tokenizer, PreTrainedTokenizerFast) or backend is None or not stop_ids:
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_ids)
        return info, serialized_table(info)
    vocab = tokenizer.get_vocab()
    encoded = [""] * vocab_size
    for token, index in vocab.items():
        if index < vocab_size:
            encoded[index] = token
    metadata = xgr.TokenizerInfo._detect_metadata_from_hf(_components(backend))
    # as from_huggingface: the vocabulary's own byte pieces outrank a decoder that transformers rebuilt
    from_vocab = xgr.TokenizerInfo._detect_vocab_type_from_vocab(vocab)
    if from_vocab is not None and from_vocab != metadata["vocab_type"]:
        metadata = {"vocab_type": from_vocab,
                    "add_prefix_space": xgr.TokenizerInfo._detect_add_prefix_space_by_encoding(tokenizer, from_vocab)}
    del vocab
    info = xgr.TokenizerInfo(encoded, vocab_type=metadata["vocab_type"], vocab_size=vocab_size,
                             stop_token_ids=stop_ids, add_prefix_space=metadata["add_prefix_space"])
    return info, json.dumps({"metadata": info.dump_metadata(), "vocab": encoded}, ensure_ascii=False).encode()


def serialized_table(info: xgr.TokenizerInfo) -> bytes:
    """Any table as `from_table` reads it, through xgrammar's own JSON (for a table built some other way)."""
    return json.dumps({"serialized": info.serialize_json()}).encode()


def from_table(table: bytes) -> xgr.TokenizerInfo:
    import xgrammar as xgr

    fields = json.loads(table)
    if "serialized" in fields:
        return xgr.TokenizerInfo.deserialize_json(fields["serialized"])
    return xgr.TokenizerInfo.from_vocab_and_metadata(fields["vocab"], fields["metadata"])


def _components(backend) -> str:
    """tokenizer.json's decoder, normalizer and pre-tokenizer (those the tokenizer has), as one JSON object."""
    parts = {name: json.loads(part.__getstate__()) for name in DETECTED_FROM
             if (part := getattr(backend, name, None)) is not None}
    return json.dumps(parts)
