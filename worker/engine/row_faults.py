"""Failures that belong to one request of a decode step, set apart so the rest of the batch goes on.

The forward runs every row at once: when it fails, the whole batch fails (engine.py). What follows it
is per row: the logits processors (bias, penalties, bans, grammar masks), the choice of the token, the
beam rules, detokenizing and building the events. The processors are vectorized over a row group, so
an exception there does not say which row caused it: the group is then processed again one row at a
time, from the same generator states (no row's sampling depends on a neighbour's failure), and only
the rows that fail alone are set apart. A row whose chosen token has a NaN logprob is set apart too:
its model output or scores are broken, and its tokens would be noise.
"""

from __future__ import annotations

import math

import structlog
import torch

from worker.decoding.batch import DecodingBatch
from worker.decoding.sampling import Choice

log = structlog.get_logger(__name__)
PLACEHOLDER_TOKEN = 0  # what a set-apart row appends; it leaves the batch at the end of the step


def choose_isolating(group: DecodingBatch, logits: torch.Tensor) -> tuple[torch.Tensor, Choice, dict[int, str]]:
    """Scores and choice of the group's rows, and {row position in the group: why it failed}."""
    generators = [row.generator.get_state() for row in group.rows]
    try:
        scores = group.process(logits)
        return scores, group.choose(scores), {}
    except Exception:
        log.exception("row_group_processing_failed", rows=len(group))
    for row, state in zip(group.rows, generators):
        row.generator.set_state(state)
    scores, choices, faults = [], [], {}
    for i in range(len(group)):
        single = group.slice(i, i + 1)
        try:
            row_scores = single.process(logits[i:i + 1])
            choice = single.choose(row_scores)
        except Exception as exc:
            log.exception("row_processing_failed", position=i)
            faults[i] = f"processing its scores failed ({type(exc).__name__})"
            row_scores = logits[i:i + 1].float()
            choice = Choice(torch.tensor([PLACEHOLDER_TOKEN], device=row_scores.device), [PLACEHOLDER_TOKEN],
                            [0.0], [None])
        scores.append(row_scores)
        choices.append(choice)
    return torch.cat(scores), Choice.concat(choices), faults


def broken_rows(choice: Choice, scores: torch.Tensor) -> dict[int, str]:
    """Rows whose chosen token has a NaN logprob: every token was ruled out, or the scores are NaN."""
    return {i: "every token was ruled out (bans, biases, grammar)" if bool(torch.isneginf(scores[i]).all())
            else "its scores were not finite numbers (NaN)"
            for i, value in enumerate(choice.logprobs) if math.isnan(value)}
