"""The most UTF-8 bytes of text that one token of a tokenizer can stand for.

With it a text is refused as too long for the context without tokenizing it: a text of B bytes is at least
ceil(B / max_token_bytes) tokens. The worker uses it before it tokenizes a prompt (worker/engine/prompt_tokens.py)
and publishes it in `/info` (`ModelInfo.max_token_bytes`) so that the gateway refuses such a text prompt before
admission. SmolLM2's is 81 (a newline and 80 spaces): its context of 8192 tokens holds at most 648 KiB of text.

It holds only for tokenizers that tokenize the text as it is: no normalizer (a normalizer may shrink the text
first: NFKC, stripped accents) and no added token that swallows the spaces around it (`lstrip` / `rstrip`). Byte-level
BPE tokenizers (SmolLM2's, GPT-2's, Llama 3's, Qwen's) qualify; for the others it is 0 (unknown) and texts are
tokenized in full, bounded only by the request body's size.
"""

from __future__ import annotations

from tokenizers import decoders

SLACK = 1  # a decoder may drop the leading space of a token decoded on its own (SentencePiece's "▁")


def max_token_bytes(tokenizer) -> int:
    """The most bytes one token of `tokenizer` covers; 0 when no such bound holds (see the module)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or backend.normalizer is not None:
        return 0
    added = list(backend.get_added_tokens_decoder().values())
    if any(token.lstrip or token.rstrip for token in added):
        return 0
    special = max((len(token.content.encode()) for token in added), default=0)
    if isinstance(backend.decoder, decoders.ByteLevel):  # one character of a byte-level token is one byte of text
        plain = max(len(piece) for piece in backend.get_vocab(with_added_tokens=False))
    else:  # decoded one by one: a token that is part of a character decodes to U+FFFD, 3 bytes, never fewer
        texts = tokenizer.batch_decode([[i] for i in range(backend.get_vocab_size(with_added_tokens=False))],
                                       skip_special_tokens=False, clean_up_tokenization_spaces=False)
        plain = max(len(text.encode()) for text in texts)
    return max(plain, special) + SLACK
