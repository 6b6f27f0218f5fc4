"""Choosing the next token of every row: greedy argmax or a seeded draw, plus logprobs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from worker.decoding.logit_stats import argmax_and_logsumexp
from worker.decoding.params import BatchParams
from worker.decoding.rows import RowState


@dataclass
class Choice:
    """The tokens chosen in one step, in row order."""

    tokens: torch.Tensor  # [B] long, on the batch device
    token_ids: list[int]
    logprobs: list[float]  # logprob of the chosen token (see `choose`)
    top_logprobs: list[list[tuple[int, float]] | None]  # top-N (token_id, logprob) where params.logprobs > 0

    @staticmethod
    def concat(parts: list[Choice]) -> Choice:
        """The choices of consecutive row groups as one."""
        if len(parts) == 1:
            return parts[0]
        return Choice(torch.cat([p.tokens for p in parts]), [t for p in parts for t in p.token_ids],
                      [lp for p in parts for lp in p.logprobs], [top for p in parts for top in p.top_logprobs])


def choose(scores: torch.Tensor, logprob_scores: torch.Tensor, params: BatchParams, rows: list[RowState]) -> Choice:
    """Pick one token per row from the warped `scores`; report logprobs from `logprob_scores`.

    Sampling is inverse-CDF with one uniform draw per sampled row from that row's own CPU generator,
    so a row's tokens depend only on its seed and history, never on what else is in the batch.
    """
    tokens, lse = argmax_and_logsumexp(scores, logprob_scores)
    sample = params.sample_rows
    if sample is not None:
        probs = torch.softmax(scores[sample], dim=-1)
        cumulative = probs.cumsum(dim=-1)
        draws = torch.stack([torch.rand((), generator=rows[i].generator) for i in sample.tolist()])
        target = draws.to(scores.device)[:, None] * cumulative[:, -1:]
        picked = torch.searchsorted(cumulative, target, right=True)[:, 0]
        # float rounding can push the target to the very end: fall back to the last possible token
        vocab = torch.arange(probs.shape[-1], device=scores.device)
        last_possible = torch.where(probs > 0, vocab, 0).amax(dim=-1)
        tokens[sample] = torch.minimum(picked, last_possible)

    # logprob of the chosen token without a full log_softmax: score - logsumexp
    chosen = logprob_scores.gather(1, tokens[:, None])[:, 0] - lse
    top: list[list[tuple[int, float]] | None] = [None] * len(rows)
    if params.max_logprobs > 0:
        values, ids = torch.topk(logprob_scores, min(params.max_logprobs, scores.shape[-1]), dim=-1)
        values = (values - lse[:, None]).tolist()
        ids = ids.tolist()
        for i, n in enumerate(params.logprobs):
            if n > 0:
                top[i] = list(zip(ids[i][:n], values[i][:n]))
    return Choice(tokens=tokens, token_ids=tokens.tolist(), logprobs=chosen.tolist(), top_logprobs=top)
