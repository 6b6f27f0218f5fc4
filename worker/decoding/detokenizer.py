"""Incremental detokenization: text deltas per token whose concatenation is the full decode.

We decode a short sliding window rather than single tokens, because a token's text depends on its
neighbours: byte-level BPE splits multi-byte characters across tokens (a lone piece decodes to
U+FFFD), and SentencePiece drops the leading space of the first token of whatever is decoded. The
window starts a few tokens back (in the prompt at first), so the first generated token keeps the
space it has in context; text is withheld while the window ends in an incomplete character.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"
PROMPT_CONTEXT = 5  # prompt tokens kept as left context for the first generated token


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_ids: list[int] | None = None, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = list(prompt_ids[-PROMPT_CONTEXT:]) if prompt_ids else []
        self.prefix_offset = 0  # the window decoded for context starts here
        self.read_offset = len(self.ids)  # text of tokens before this has been emitted
        self.prefix_text = self._decode(self.prefix_offset, self.read_offset)

    def _decode(self, start: int, end: int) -> str:
        if start >= end:
            return ""
        return self.tokenizer.decode(self.ids[start:end], skip_special_tokens=self.skip_special_tokens)

    def push(self, token_id: int) -> str:
        """Add one generated token; return the new text ("" while a character is incomplete)."""
        self.ids.append(token_id)
        text = self._decode(self.prefix_offset, len(self.ids))
        if text.endswith(REPLACEMENT) or len(text) <= len(self.prefix_text):
            return ""  # incomplete character, or a token with no text of its own (yet)
        return self._advance(text)

    def flush(self) -> str:
        """Whatever was withheld (an incomplete character decodes as U+FFFD, as in the full decode)."""
        text = self._decode(self.prefix_offset, len(self.ids))
        if len(text) <= len(self.prefix_text):
            return ""
        return self._advance(text)

    def _advance(self, text: str) -> str:
        delta = text[len(self.prefix_text) :]
        # the emitted tokens become the next window's left context
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        self.prefix_text = self._decode(self.prefix_offset, self.read_offset)
        return delta
