"""Bad-word phrases to token ids with the model tokenizer."""

from __future__ import annotations


def tokenize_bad_words(tokenizer, phrases: list[str]) -> list[list[int]]:
    """Each phrase as given, and also with one leading space when it has none.

    A word inside a sentence is a different token from the same word at the start of a text in
    byte-level BPE ("Ġword" vs "word") and in SentencePiece ("▁word"), so banning only the phrase as
    typed would let it through mid-sentence. Duplicates are dropped; empty phrases are ignored.
    """
    out: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()
    for phrase in phrases:
        variants = [phrase] if not phrase or phrase[0].isspace() else [phrase, " " + phrase]
        for text in variants:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
            if ids and tuple(ids) not in seen:
                seen.add(tuple(ids))
                out.append(list(ids))
    return out
