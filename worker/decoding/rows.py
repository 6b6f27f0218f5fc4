"""What one row of the decoding batch is made of: its request settings and its running state."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch

from common.protocol import SamplingParams
from worker.decoding.grammar import Grammar, GrammarState
from worker.decoding.ngrams import NGramIndex


@dataclass
class RowSpec:
    """Everything the engine knows about a row when it joins the batch.

    `eos_token_ids` is the model's EOS ids plus `params.eos_token_ids`, or [] when `params.ignore_eos`.
    `bad_word_ids` is `tokenize_bad_words(tokenizer, params.bad_words)`; `params.bad_word_tokens` is
    read from `params` directly.
    """

    params: SamplingParams
    prompt_ids: list[int]
    seed: int
    eos_token_ids: list[int] = field(default_factory=list)
    bad_word_ids: list[list[int]] = field(default_factory=list)
    grammar: Grammar | None = None  # structured-output constraint, compiled (worker/decoding/grammar)


class RowState:
    """Per-row mutable state: token history, seeded generator and n-gram indexes."""

    def __init__(self, spec: RowSpec):
        params = spec.params
        self.spec = spec
        self.history: list[int] = list(spec.prompt_ids)
        self.prompt_len = len(spec.prompt_ids)
        # CPU generator whatever the device, so a seed gives the same tokens on CPU and GPU.
        self.generator = torch.Generator().manual_seed(spec.seed)
        self.ngrams = (NGramIndex(params.no_repeat_ngram_size, spec.prompt_ids)
                       if params.no_repeat_ngram_size > 0 else None)
        self.encoder_ngrams = (
            NGramIndex(params.encoder_no_repeat_ngram_size, spec.prompt_ids)
            if params.encoder_no_repeat_ngram_size > 0
            else None
        )
        self.multi_token_bans = _multi_token_bans(spec)
        # the grammar ends on the row's EOS ids, or on the model's when ignore_eos emptied them
        self.grammar = GrammarState(spec.grammar, spec.eos_token_ids) if spec.grammar is not None else None

    @property
    def output_len(self) -> int:
        return len(self.history) - self.prompt_len

    def append(self, token: int) -> None:
        self.history.append(token)
        if self.ngrams is not None:
            self.ngrams.extend(self.history)
        if self.grammar is not None:
            self.grammar.advance(token)

    def fork(self) -> RowState:
        """An independent copy (generator state included) for a duplicated row."""
        twin = copy.copy(self)
        twin.history = list(self.history)
        twin.generator = torch.Generator()
        twin.generator.set_state(self.generator.get_state())
        if self.ngrams is not None:
            twin.ngrams = self.ngrams.copy()
        if self.grammar is not None:
            twin.grammar = self.grammar.fork()
        return twin

    def reseed(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)


def _multi_token_bans(spec: RowSpec) -> dict[tuple[int, ...], list[int]]:
    """Bad phrases of 2+ tokens as {prefix: [last tokens]}; single tokens are banned as a static mask."""
    bans: dict[tuple[int, ...], list[int]] = {}
    for phrase in [*spec.bad_word_ids, *spec.params.bad_word_tokens]:
        if len(phrase) > 1:
            bans.setdefault(tuple(phrase[:-1]), []).append(phrase[-1])
    return bans


def single_token_bans(spec: RowSpec) -> list[int]:
    """Single-token bad words. As in transformers, a bad word that is exactly one EOS id is ignored."""
    eos = set(spec.eos_token_ids)
    return sorted({p[0] for p in [*spec.bad_word_ids, *spec.params.bad_word_tokens] if len(p) == 1 and p[0] not in eos})
