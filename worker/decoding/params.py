"""Per-batch parameter tensors: one tensor per setting, one entry per row (TGI's heterogeneous style).

Rebuilt from the rows only when the batch composition changes (add / filter / reorder), so a decode
step reads ready tensors. For each setting we also keep the index of the rows where it is active, so a
step touches only those rows, and a setting no row uses costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from worker.decoding.rows import RowState, single_token_bans


def _rows_where(flags: list[bool], device) -> torch.Tensor | None:
    """Index of active rows; None when no row is active."""
    idx = [i for i, f in enumerate(flags) if f]
    return torch.tensor(idx, dtype=torch.long, device=device) if idx else None


@dataclass
class BatchParams:
    greedy: torch.Tensor  # [B] bool
    temperature: torch.Tensor  # [B]; 1 for greedy rows (they skip warping)
    top_k: torch.Tensor  # [B] long
    top_p: torch.Tensor
    min_p: torch.Tensor
    typical_p: torch.Tensor
    repetition_penalty: torch.Tensor
    encoder_repetition_inverse: torch.Tensor  # 1 / penalty, computed in double as transformers does
    presence_penalty: torch.Tensor
    frequency_penalty: torch.Tensor
    min_new_tokens: torch.Tensor  # [B] long: EOS/stop ids are masked while output_len < this
    watermark_gamma: torch.Tensor
    watermark_delta: torch.Tensor
    # rows where each setting is active (None = nowhere)
    sample_rows: torch.Tensor | None
    temperature_rows: torch.Tensor | None
    top_k_rows: torch.Tensor | None
    top_p_rows: torch.Tensor | None
    min_p_rows: torch.Tensor | None
    typical_p_rows: torch.Tensor | None
    repetition_rows: torch.Tensor | None
    encoder_repetition_rows: torch.Tensor | None
    count_penalty_rows: torch.Tensor | None
    min_tokens_rows: torch.Tensor | None
    watermark_rows: torch.Tensor | None
    # static (row, token[, value]) lists
    bias_pairs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
    ban_pairs: tuple[torch.Tensor, torch.Tensor] | None
    end_pairs: tuple[torch.Tensor, torch.Tensor] | None  # EOS + stop ids, masked under min tokens
    # rows that need a Python look-up each step
    ngram_rows: list[int]
    encoder_ngram_rows: list[int]
    multi_ban_rows: list[int]
    logprobs: list[int]  # top-N per row (0 = chosen token only, also when off)
    max_logprobs: int

    @property
    def edits_scores(self) -> bool:
        """Whether a processor before the warpers writes into the scores (a bias, a penalty, a ban)."""
        return (self.bias_pairs is not None or self.ban_pairs is not None or self.end_pairs is not None
                or self.repetition_rows is not None or self.encoder_repetition_rows is not None
                or self.count_penalty_rows is not None
                or bool(self.ngram_rows or self.encoder_ngram_rows or self.multi_ban_rows))


def min_new_tokens(state: RowState) -> int:
    p = state.spec.params
    total = 0 if p.min_total_tokens is None else p.min_total_tokens - state.prompt_len
    return max(p.min_tokens, total, 0)


def build_params(rows: list[RowState], vocab_size: int, device) -> BatchParams:
    ps = [r.spec.params for r in rows]
    greedy = [p.temperature == 0 for p in ps]

    def vec(values, dtype=torch.float32):
        return torch.tensor(values, dtype=dtype, device=device)

    # Warpers are neutral on greedy rows: transformers applies them only when sampling.
    temperature = [1.0 if g else p.temperature for p, g in zip(ps, greedy)]
    top_k = [vocab_size if g or p.top_k <= 0 else min(p.top_k, vocab_size) for p, g in zip(ps, greedy)]
    top_p = [1.0 if g else p.top_p for p, g in zip(ps, greedy)]
    min_p = [0.0 if g else p.min_p for p, g in zip(ps, greedy)]
    typical_p = [1.0 if g else p.typical_p for p, g in zip(ps, greedy)]
    min_new = [min_new_tokens(r) for r in rows]
    gamma = [p.watermark.gamma if p.watermark else 0.0 for p in ps]
    delta = [p.watermark.delta if p.watermark else 0.0 for p in ps]

    bias, bans, ends = [], [], []
    for i, r in enumerate(rows):
        bias += [(i, int(t), float(b)) for t, b in r.spec.params.logit_bias.items()]
        bans += [(i, t) for t in single_token_bans(r.spec)]
        if min_new[i] > 0:
            ends += [(i, t) for t in sorted({*r.spec.eos_token_ids, *r.spec.params.stop_token_ids})]

    def pairs(items):
        if not items:
            return None
        cols = list(zip(*items))
        out = [torch.tensor(cols[0], dtype=torch.long, device=device),
               torch.tensor(cols[1], dtype=torch.long, device=device)]
        if len(cols) == 3:
            out.append(vec(cols[2]))
        return tuple(out)

    logprobs = [p.logprobs or 0 for p in ps]
    return BatchParams(
        greedy=vec(greedy, torch.bool),
        temperature=vec(temperature),
        top_k=vec(top_k, torch.long),
        top_p=vec(top_p),
        min_p=vec(min_p),
        typical_p=vec(typical_p),
        repetition_penalty=vec([p.repetition_penalty for p in ps]),
        encoder_repetition_inverse=vec([1.0 / p.encoder_repetition_penalty for p in ps]),
        presence_penalty=vec([p.presence_penalty for p in ps]),
        frequency_penalty=vec([p.frequency_penalty for p in ps]),
        min_new_tokens=vec(min_new, torch.long),
        watermark_gamma=vec(gamma),
        watermark_delta=vec(delta),
        sample_rows=_rows_where([not g for g in greedy], device),
        temperature_rows=_rows_where([t != 1.0 for t in temperature], device),
        top_k_rows=_rows_where([k < vocab_size for k in top_k], device),
        top_p_rows=_rows_where([p < 1.0 for p in top_p], device),
        min_p_rows=_rows_where([p > 0.0 for p in min_p], device),
        typical_p_rows=_rows_where([p < 1.0 for p in typical_p], device),
        repetition_rows=_rows_where([p.repetition_penalty != 1.0 for p in ps], device),
        encoder_repetition_rows=_rows_where([p.encoder_repetition_penalty != 1.0 for p in ps], device),
        count_penalty_rows=_rows_where([p.presence_penalty != 0.0 or p.frequency_penalty != 0.0 for p in ps], device),
        min_tokens_rows=_rows_where([m > 0 for m in min_new], device),
        watermark_rows=_rows_where([p.watermark is not None for p in ps], device),
        bias_pairs=pairs(bias),
        ban_pairs=pairs(bans),
        end_pairs=pairs(ends),
        ngram_rows=[i for i, r in enumerate(rows) if r.ngrams is not None],
        encoder_ngram_rows=[i for i, r in enumerate(rows) if r.encoder_ngrams is not None],
        multi_ban_rows=[i for i, r in enumerate(rows) if r.multi_token_bans],
        logprobs=logprobs,
        max_logprobs=max(logprobs, default=0),
    )


def on_rows(scores: torch.Tensor, rows: torch.Tensor | None, fn) -> torch.Tensor:
    """Apply `fn(sub_scores, row_index)` to the active rows only; returns the updated scores.

    When every row is active we skip the gather/scatter and let `fn` work on the whole tensor.
    """
    if rows is None:
        return scores
    if rows.numel() == scores.shape[0]:
        return fn(scores, slice(None))
    scores[rows] = fn(scores[rows], rows)
    return scores
