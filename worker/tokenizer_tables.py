"""A loaded tokenizer without the Python tables it was built from.

transformers 5's tokenizer classes (Gemma's, Llama's, GPT-2's, Qwen2's and some 25 others) keep the vocabulary
dict and the merges list they hand to the Rust `tokenizers` model they build (`_vocab`, `_merges`) and read them
again only to save a few classes' vocabulary files, which a worker never does: encoding, decoding, the vocabulary
and the chat template all go through the Rust tokenizer. For Gemma 3 (262,144 tokens, 514,906 merges) those
Python objects held ~180 MB of the worker's ~1,040 MB at ready.
"""

from __future__ import annotations

BUILD_TABLES = ("_vocab", "_merges")


def drop_build_tables(tokenizer) -> None:
    """Free `tokenizer`'s copies of the tables its Rust tokenizer was built from (a tokenizer without a Rust
    one, which encodes with them, keeps them)."""
    if type(getattr(tokenizer, "_tokenizer", None)).__module__.split(".")[0] != "tokenizers":
        return
    for name in BUILD_TABLES:
        vars(tokenizer).pop(name, None)
