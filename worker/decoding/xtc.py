"""XTC, "exclude top choices" (Friendli `xtc_threshold` / `xtc_probability`).

On a step that triggers (probability `xtc_probability`, drawn from the row's own seeded generator),
every token at least `xtc_threshold` likely is removed except the least likely of them, when two or
more qualify: the obvious continuations give way to a still-plausible one. Only sampled rows use it.
"""

from __future__ import annotations

import torch

from worker.decoding.rows import RowState

FILTERED = -float("inf")


def xtc_rows(rows: list[RowState]) -> list[int]:
    return [i for i, row in enumerate(rows)
            if row.spec.params.xtc_probability > 0 and row.spec.params.xtc_threshold > 0
            and row.spec.params.temperature > 0]


def apply_xtc(scores: torch.Tensor, positions: list[int], rows: list[RowState]) -> None:
    for i in positions:
        params = rows[i].spec.params
        if float(torch.rand((), generator=rows[i].generator)) >= params.xtc_probability:
            continue
        probs = scores[i].softmax(dim=-1)
        top = (probs >= params.xtc_threshold).nonzero()[:, 0]
        if top.numel() < 2:
            continue
        keep = top[probs[top].argmin()]
        kept = scores[i, keep].clone()
        scores[i, top] = FILTERED
        scores[i, keep] = kept
