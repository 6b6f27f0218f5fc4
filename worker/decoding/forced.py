"""Forced outputs (Friendli `forced_output_tokens`, used for scoring such as MMLU): while a row has
forced tokens left, its next token is the forced one, reported with the logprob the model gives it."""

from __future__ import annotations

import torch

from worker.decoding.rows import RowState


def force_tokens(choice, logprob_scores: torch.Tensor, rows: list[RowState]) -> None:
    for i, row in enumerate(rows):
        forced = row.spec.params.forced_output_tokens
        step = row.output_len
        if step >= len(forced):
            continue
        token = forced[step]
        choice.tokens[i] = token
        choice.token_ids[i] = token
        choice.logprobs[i] = float(logprob_scores[i, token] - torch.logsumexp(logprob_scores[i], dim=-1))
