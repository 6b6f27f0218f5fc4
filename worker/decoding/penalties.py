"""Token-presence state and the penalties that read it (repetition, encoder repetition, presence, frequency).

Each [B, V] tensor exists only while some row of the batch needs it; rows that do not need it hold
zeros there, which is harmless because their penalty is neutral.
"""

from __future__ import annotations

import torch

from worker.decoding.params import BatchParams, on_rows
from worker.decoding.rows import RowState


class RowTensors:
    """Lazily allocated [B, V] tensors that follow the batch through add / reorder / append."""

    def __init__(self, vocab_size: int, device):
        self.vocab_size = vocab_size
        self.device = device
        self.seen: torch.Tensor | None = None  # bool, prompt + output (repetition_penalty, HF)
        self.prompt: torch.Tensor | None = None  # bool, prompt only (encoder_repetition_penalty)
        self.counts: torch.Tensor | None = None  # float, output only (presence / frequency, OpenAI)
        self.rows = 0

    def _grow(self, name: str, dtype, fill_ids: list[int] | None, add: bool) -> None:
        """Append one row to tensor `name`, allocating it for the existing rows first if needed."""
        current = getattr(self, name)
        if current is None and fill_ids is None:
            return
        if current is None:
            current = torch.zeros(self.rows, self.vocab_size, dtype=dtype, device=self.device)
        row = torch.zeros(1, self.vocab_size, dtype=dtype, device=self.device)
        if fill_ids:
            ids = torch.tensor(fill_ids, dtype=torch.long, device=self.device)
            if add:
                row[0].index_put_((ids,), torch.ones_like(ids, dtype=dtype), accumulate=True)
            else:
                row[0, ids] = True
        setattr(self, name, torch.cat([current, row]))

    def add(self, state: RowState) -> None:
        """A row joins with what it has seen so far: its prompt, and its output when it resumes."""
        p = state.spec.params
        prompt, output = state.spec.prompt_ids, state.history[state.prompt_len:]
        self._grow("seen", torch.bool, state.history if p.repetition_penalty != 1.0 else None, add=False)
        self._grow("prompt", torch.bool, prompt if p.encoder_repetition_penalty != 1.0 else None, add=False)
        wants_counts = p.presence_penalty != 0.0 or p.frequency_penalty != 0.0
        self._grow("counts", torch.float32, output if wants_counts else None, add=True)
        self.rows += 1

    def reorder(self, index: torch.Tensor, params: BatchParams) -> None:
        self.rows = len(index)
        # drop a tensor once no remaining row needs it
        for name, needed in (
            ("seen", params.repetition_rows),
            ("prompt", params.encoder_repetition_rows),
            ("counts", params.count_penalty_rows),
        ):
            current = getattr(self, name)
            if current is not None:
                setattr(self, name, current.index_select(0, index) if needed is not None else None)

    def slice(self, first: int, end: int) -> RowTensors:
        """Rows first..end-1 as views: `append` on the result updates these tensors in place."""
        view = RowTensors(self.vocab_size, self.device)
        for name in ("seen", "prompt", "counts"):
            current = getattr(self, name)
            setattr(view, name, None if current is None else current[first:end])
        view.rows = end - first
        return view

    def append(self, tokens: torch.Tensor) -> None:
        if self.seen is None and self.counts is None:
            return
        rows = torch.arange(len(tokens), device=self.device)
        if self.seen is not None:
            self.seen[rows, tokens] = True
        if self.counts is not None:
            self.counts[rows, tokens] += 1


def apply_penalties(scores: torch.Tensor, params: BatchParams, state: RowTensors) -> torch.Tensor:
    """In transformers' order: encoder repetition, repetition, then OpenAI presence/frequency."""

    def encoder_repetition(s, rows):
        # transformers multiplies negative scores by 1/penalty: a penalty > 1 favours prompt tokens.
        inv = params.encoder_repetition_inverse[rows, None]
        return torch.where(state.prompt[rows], torch.where(s < 0, s * inv, s / inv), s)

    def repetition(s, rows):
        p = params.repetition_penalty[rows, None]
        return torch.where(state.seen[rows], torch.where(s < 0, s * p, s / p), s)

    def counts(s, rows):
        c = state.counts[rows]
        return s - (params.frequency_penalty[rows, None] * c + params.presence_penalty[rows, None] * (c > 0))

    scores = on_rows(scores, params.encoder_repetition_rows, encoder_repetition)
    scores = on_rows(scores, params.repetition_rows, repetition)
    return on_rows(scores, params.count_penalty_rows, counts)
