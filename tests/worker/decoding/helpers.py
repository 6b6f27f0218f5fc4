"""Shared test helpers: build rows and run transformers' processors on one row alone."""

from __future__ import annotations

import torch
from transformers.generation.logits_process import (
    EncoderNoRepeatNGramLogitsProcessor,
    EncoderRepetitionPenaltyLogitsProcessor,
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    NoBadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

from common.protocol import SamplingParams
from worker.decoding import RowSpec


def spec(prompt: list[int], seed: int = 0, eos: list[int] | None = None, bad_word_ids=None, **params) -> RowSpec:
    return RowSpec(
        params=SamplingParams(**params),
        prompt_ids=list(prompt),
        seed=seed,
        eos_token_ids=list(eos or []),
        bad_word_ids=list(bad_word_ids or []),
    )


def hf_processors(row: RowSpec) -> LogitsProcessorList:
    """transformers' processors for one row, in the order `generate()` builds them.

    Single-token bad words go through SuppressTokensLogitsProcessor (what they are), longer ones
    through NoBadWordsLogitsProcessor.
    """
    p = row.params
    prompt = torch.tensor([row.prompt_ids])
    out = LogitsProcessorList()
    if p.logit_bias:
        out.append(SequenceBiasLogitsProcessor([[[int(t)], float(b)] for t, b in p.logit_bias.items()]))
    if p.encoder_repetition_penalty != 1.0:
        out.append(EncoderRepetitionPenaltyLogitsProcessor(float(p.encoder_repetition_penalty), prompt))
    if p.repetition_penalty != 1.0:
        out.append(RepetitionPenaltyLogitsProcessor(float(p.repetition_penalty)))
    if p.no_repeat_ngram_size > 0:
        out.append(NoRepeatNGramLogitsProcessor(p.no_repeat_ngram_size))
    if p.encoder_no_repeat_ngram_size > 0:
        out.append(EncoderNoRepeatNGramLogitsProcessor(p.encoder_no_repeat_ngram_size, prompt))
    phrases = [*row.bad_word_ids, *p.bad_word_tokens]
    multi = [w for w in phrases if len(w) > 1]
    if multi:
        out.append(NoBadWordsLogitsProcessor(multi, row.eos_token_ids or None))
    single = [w[0] for w in phrases if len(w) == 1 and w[0] not in row.eos_token_ids]
    if p.min_tokens > 0 and row.eos_token_ids:
        out.append(MinNewTokensLengthLogitsProcessor(len(row.prompt_ids), p.min_tokens, row.eos_token_ids))
    if single:
        out.append(SuppressTokensLogitsProcessor(single))
    if p.temperature != 0:
        if p.temperature != 1.0:
            out.append(TemperatureLogitsWarper(float(p.temperature)))
        if p.top_k > 0:
            out.append(TopKLogitsWarper(p.top_k))
        if p.top_p < 1.0:
            out.append(TopPLogitsWarper(p.top_p))
        if p.min_p > 0:
            out.append(MinPLogitsWarper(p.min_p))
        if p.typical_p < 1.0:
            out.append(TypicalLogitsWarper(p.typical_p))
    return out


def hf_scores(row: RowSpec, history: list[int], logits: torch.Tensor) -> torch.Tensor:
    """transformers' processed scores for one row alone ([V] in, [V] out)."""
    return hf_processors(row)(torch.tensor([history]), logits[None].clone())[0]


def first_stop(text: str, stops: list[str]) -> tuple[str, str | None]:
    """What a stop-string matcher must give for the whole text: the text before the stop that completes
    first (ties: the one starting first), and that stop; or the text and None."""
    best = None
    for stop in stops:
        start = text.find(stop) if stop else -1
        if start >= 0 and (best is None or (start + len(stop), start) < best[:2]):
            best = (start + len(stop), start, stop)
    return (text, None) if best is None else (text[: best[1]], best[2])
