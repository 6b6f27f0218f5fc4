"""Sampling warpers with one parameter per row: temperature, top-k, top-p, min-p, typical-p.

Each works on the rows where it is active only, in transformers' order, with transformers' math and
filter value (-inf), so a row gives the same scores as transformers run on that row alone.
"""

from __future__ import annotations

import torch

from worker.decoding.params import BatchParams, on_rows

FILTERED = -float("inf")
TOP_P_CANDIDATES = 256  # top-p looks at this many best tokens first, and sorts the whole row only if needed


def apply_warpers(scores: torch.Tensor, params: BatchParams) -> torch.Tensor:
    """Greedy rows are never listed as active, so they pass through unchanged."""
    scores = on_rows(scores, params.temperature_rows, lambda s, r: s / params.temperature[r, None])
    scores = on_rows(scores, params.top_k_rows, lambda s, r: _top_k(s, params.top_k[r]))
    scores = on_rows(scores, params.top_p_rows, lambda s, r: _top_p(s, params.top_p[r]))
    scores = on_rows(scores, params.min_p_rows, lambda s, r: _min_p(s, params.min_p[r]))
    return on_rows(scores, params.typical_p_rows, lambda s, r: _typical_p(s, params.typical_p[r]))


def _top_k(s: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    # Keep every score >= the k-th largest of its row (ties kept, as transformers does).
    top = torch.topk(s, int(k.max()), dim=-1).values
    kth = top.gather(1, (k - 1)[:, None])
    return s.masked_fill(s < kth, FILTERED)


def _top_p(s: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """transformers removes a token when the ascending cumulative probability up to it is <= 1 - p,
    i.e. when the probability mass strictly above it is >= p. Sorting the whole vocabulary is the
    costly part, so we first try the best TOP_P_CANDIDATES tokens: when they already hold mass >= p,
    every token outside them is removed and only the candidates need ranking. Only the rows whose
    candidates hold less are sorted whole."""
    probs = s.softmax(dim=-1)
    k = min(TOP_P_CANDIDATES, s.shape[-1])
    top, order = torch.topk(probs, k, dim=-1)
    above = top.cumsum(dim=-1) - top  # mass strictly above each candidate
    keep = above < p[:, None]
    keep[:, 0] = True  # always keep the most likely token
    kept = torch.zeros_like(s, dtype=torch.bool).scatter_(1, order, keep)
    warped = s.masked_fill(~kept, FILTERED)
    if k < s.shape[-1]:
        short = (top.sum(-1) < p).nonzero()[:, 0]
        if len(short):
            warped[short] = _top_p_full_sort(s[short], p[short])
    return warped


def _top_p_full_sort(s: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    sorted_s, order = torch.sort(s, descending=False)
    cumulative = sorted_s.softmax(dim=-1).cumsum(dim=-1)
    remove = cumulative <= (1 - p)[:, None]
    remove[:, -1] = False  # always keep the most likely token
    return s.masked_fill(remove.scatter(1, order, remove), FILTERED)


def _min_p(s: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    probs = torch.softmax(s, dim=-1)
    remove = probs < min_p[:, None] * probs.amax(dim=-1, keepdim=True)
    remove.scatter_(1, probs.argmax(dim=-1, keepdim=True), False)
    return s.masked_fill(remove, FILTERED)


def _typical_p(s: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    # Keep the tokens whose surprise is closest to the entropy until `mass` is covered.
    logp = torch.log_softmax(s, dim=-1)
    entropy = -(logp * logp.exp()).nansum(-1, keepdim=True)
    distance, order = torch.sort((-logp - entropy).abs(), descending=False)
    cumulative = s.gather(-1, order).softmax(dim=-1).cumsum(dim=-1)
    last = (cumulative < mass[:, None]).sum(dim=1).clamp_(max=s.shape[-1] - 1)
    remove = distance > distance.gather(1, last[:, None])
    remove[:, 0] = False
    return s.masked_fill(remove.scatter(1, order, remove), FILTERED)
