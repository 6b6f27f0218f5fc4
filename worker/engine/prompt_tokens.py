"""A text prompt's token ids, tokenizing no more text than the context can hold.

Tokenizing costs time in proportion to the text (SmolLM2's tokenizer: about 1.5 MB/s on one core), and a request
body may hold megabytes. What admission reserved for a request is at most the model's context, so that is all
the text this worker tokenizes for it, by `max_token_bytes` (worker/token_bytes.py: the most bytes one token can
cover):
- a text of more than `max_context * max_token_bytes` bytes is at least `max_context` tokens: refused as too long
  before any tokenizing (the gateway refuses a plain text prompt the same way, before admission);
- under `truncate` (keep the last N tokens), only the text's last `2 * N * max_token_bytes` bytes are tokenized:
  at least 2N tokens, of which the last N are kept (cutting the text changes at most the first of them).
A tokenizer without such a bound (max_token_bytes 0) tokenizes the whole text.
"""

from __future__ import annotations

from worker.engine.prepare_errors import RequestRejected

TAIL_FACTOR = 2  # a truncated prompt's tail holds at least this many times `truncate` tokens


def text_ids(tokenizer, text: str, *, add_special_tokens: bool, max_context: int, truncate: int | None,
             max_token_bytes: int, field: str) -> list[int]:
    """The ids of `text` as `tokenizer(text)` gives them (their last `truncate` when set), or RequestRejected
    (too_long) for a text that the context certainly cannot hold."""
    if max_token_bytes > 0 and len(text) * 4 > max_context * max_token_bytes:  # short texts skip the encode
        size = len(text.encode())
        if truncate is not None and truncate < max_context:
            keep = TAIL_FACTOR * truncate * max_token_bytes
            if size > keep:  # the tail, from the first whole character
                text = text.encode()[size - keep:].decode(errors="ignore")
        else:
            least = -(-size // max_token_bytes)
            if least >= max_context:
                raise RequestRejected(f"the prompt is {size} bytes, at least {least} tokens; this model's context is "
                                      f"{max_context} tokens", field, kind="too_long",
                                      sizes={"max_context": max_context})
    return tokenizer(text, add_special_tokens=add_special_tokens).input_ids
