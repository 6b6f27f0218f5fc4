"""Bans and biases that set or shift single scores: logit bias, bad words, n-gram bans, min tokens."""

from __future__ import annotations

import torch

from worker.decoding.params import BatchParams
from worker.decoding.rows import RowState

BANNED = -float("inf")


def apply_logit_bias(scores: torch.Tensor, params: BatchParams) -> None:
    if params.bias_pairs is not None:
        rows, tokens, bias = params.bias_pairs
        scores.index_put_((rows, tokens), bias, accumulate=True)


def apply_bans(scores: torch.Tensor, params: BatchParams, rows: list[RowState]) -> None:
    """In place: n-gram bans, encoder n-gram bans, bad words, then the min-tokens EOS/stop mask."""
    banned_rows: list[int] = []
    banned_tokens: list[int] = []

    def ban(i: int, tokens) -> None:
        banned_rows.extend([i] * len(tokens))
        banned_tokens.extend(tokens)

    # These need a dict look-up on each row's own history: a short loop over the rows that use them.
    for i in params.ngram_rows:
        ban(i, rows[i].ngrams.banned(rows[i].history))
    for i in params.encoder_ngram_rows:
        ban(i, rows[i].encoder_ngrams.banned(rows[i].history))
    for i in params.multi_ban_rows:
        history = rows[i].history
        for prefix, last in rows[i].multi_token_bans.items():
            n = len(prefix)
            if n <= len(history) and tuple(history[-n:]) == prefix:
                ban(i, last)
    if banned_rows:
        device = scores.device
        index = (torch.tensor(banned_rows, device=device), torch.tensor(banned_tokens, device=device))
        scores.index_put_(index, torch.tensor(BANNED, device=device))
    if params.ban_pairs is not None:
        scores.index_put_(params.ban_pairs, torch.tensor(BANNED, device=scores.device))
    if params.end_pairs is not None:
        output_len = torch.tensor([r.output_len for r in rows], device=scores.device)
        row_ids, tokens = params.end_pairs
        active = output_len[row_ids] < params.min_new_tokens[row_ids]
        scores.index_put_((row_ids[active], tokens[active]), torch.tensor(BANNED, device=scores.device))
