"""The decoding batch: per-row settings and state, vectorized logits processing and token choice.

Each engine step, for the rows of the running batch in order:

    scores = batch.process(logits)      # [B, V] raw logits -> processed + warped scores
    choice = batch.choose(scores)       # tokens, logprobs, top logprobs
    batch.append(choice.tokens)         # extend every row's history
    ... finish checks, detokenize, stop strings ...
    batch.filter(keep)                  # drop finished rows (or reorder / add between steps)

Processing order follows transformers' `generate()`: logit bias, encoder repetition penalty,
repetition penalty, (presence / frequency penalties), no-repeat n-grams, encoder no-repeat n-grams,
bad words, min-tokens EOS mask, then the grammar mask of constrained rows; then, for sampled rows only,
temperature, top-k, top-p, min-p, typical-p; then the watermark (transformers also applies it last, after the warpers).

Logprobs are log_softmax of the scores after the processors and before warping and watermark: a
greedy row reports the model's own distribution under its penalties and bans. This is
transformers' `output_scores` for a greedy row without watermark, and `output_logits` (raw) when no
processor is active; for sampled rows `output_scores` is the warped distribution instead.
"""

from __future__ import annotations

import torch

from worker.decoding.bans import apply_bans, apply_logit_bias
from worker.decoding.forced import force_tokens
from worker.decoding.grammar import GrammarMasker
from worker.decoding.params import BatchParams, build_params
from worker.decoding.penalties import RowTensors, apply_penalties
from worker.decoding.rows import RowSpec, RowState
from worker.decoding.sampling import Choice, choose
from worker.decoding.warpers import apply_warpers
from worker.decoding.watermark import apply_watermark
from worker.decoding.xtc import apply_xtc, xtc_rows

__all__ = ["Choice", "DecodingBatch", "RowSpec"]


class DecodingBatch:
    def __init__(self, vocab_size: int, device: torch.device | str = "cpu"):
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        self.rows: list[RowState] = []
        self.tensors = RowTensors(vocab_size, self.device)
        self._params: BatchParams | None = None
        self._logprob_scores: torch.Tensor | None = None
        self._grammar_masker: GrammarMasker | None = None
        self._views: dict[tuple[int, int], DecodingBatch] = {}

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def params(self) -> BatchParams:
        if self._params is None:  # rebuilt only after the composition changed
            self._params = build_params(self.rows, self.vocab_size, self.device)
        return self._params

    def add(self, spec: RowSpec) -> None:
        """Append a row at the end."""
        self.add_row(RowState(spec))

    def add_row(self, state: RowState) -> None:
        """Append a row with the state it already has (a preempted row resuming: its history and
        generator go on where they were)."""
        self.rows.append(state)
        self.tensors.add(state)
        self._params = None
        self._views = {}

    def prefix(self, count: int) -> DecodingBatch:
        """The first `count` rows as a batch of their own for a step that leaves the others out."""
        return self.slice(0, count)

    def slice(self, first: int, end: int) -> DecodingBatch:
        """Rows first..end-1 as a batch of their own (a beam-free step, or one row group of a step).
        It shares their state: `process`, `choose` and `append` on it advance those rows here too.
        Valid until this batch's composition changes (add, reorder)."""
        if (first, end) == (0, len(self.rows)):
            return self
        view = self._views.get((first, end))
        if view is None:
            view = DecodingBatch(self.vocab_size, self.device)
            view.rows = self.rows[first:end]
            view.tensors = self.tensors.slice(first, end)
            self._views[(first, end)] = view
        return view

    def filter(self, keep: list[int]) -> None:
        """Keep the rows at these positions (current order), drop the rest."""
        self.reorder(keep)

    def reorder(self, index: list[int]) -> None:
        """Rows become [old[i] for i in index]; a duplicated row gets an independent copy of its state
        (its generator included: call `reseed` on a fork that must sample differently)."""
        used: set[int] = set()
        rows = []
        for i in index:
            rows.append(self.rows[i].fork() if i in used else self.rows[i])
            used.add(i)
        self.rows = rows
        self._params = None
        self._views = {}
        self.tensors.reorder(torch.tensor(index, dtype=torch.long, device=self.device), self.params)
        self._logprob_scores = None

    def reseed(self, position: int, seed: int) -> None:
        self.rows[position].reseed(seed)

    def process(self, logits: torch.Tensor) -> torch.Tensor:
        """[B, V] raw logits -> scores to choose from (the input is not modified)."""
        if logits.shape != (len(self.rows), self.vocab_size):
            raise ValueError(f"logits {tuple(logits.shape)} != ({len(self.rows)}, {self.vocab_size})")
        params = self.params
        # a copy only where something writes into it: the usual greedy or plainly sampled row reads the logits
        edited = params.edits_scores or any(r.grammar is not None for r in self.rows)
        scores = logits.to(device=self.device, dtype=torch.float32, copy=edited)
        apply_logit_bias(scores, params)
        scores = apply_penalties(scores, params, self.tensors)
        apply_bans(scores, params, self.rows)
        self._apply_grammars(scores, logits)
        self._logprob_scores = scores
        if params.sample_rows is None and params.watermark_rows is None:
            return scores
        scores = apply_warpers(scores.clone(), params)
        xtc = xtc_rows(self.rows)
        if xtc:
            apply_xtc(scores, xtc, self.rows)
        if params.watermark_rows is not None:
            rows = params.watermark_rows
            previous = torch.tensor([self.rows[i].history[-1] for i in rows.tolist()], device=self.device)
            apply_watermark(scores, rows, previous, params.watermark_gamma[rows], params.watermark_delta[rows])
        return scores

    def _apply_grammars(self, scores: torch.Tensor, logits: torch.Tensor) -> None:
        """Constrained rows keep only the tokens their grammar allows (EOS only once it accepts)."""
        rows = [i for i, r in enumerate(self.rows) if r.grammar is not None and not r.grammar.terminated]
        if not rows:
            return
        if self._grammar_masker is None:
            self._grammar_masker = GrammarMasker(self.vocab_size)
        banning = [i for i in rows if _bans_tokens(self.rows[i])]
        self._grammar_masker.apply(scores, logits, [self.rows[i].grammar for i in rows], rows, banning)

    def choose(self, scores: torch.Tensor) -> Choice:
        """Tokens from the scores of the last `process` call; logprobs from its pre-warp scores."""
        logprob_scores = self._logprob_scores if self._logprob_scores is not None else scores
        choice = choose(scores, logprob_scores, self.params, self.rows)
        force_tokens(choice, logprob_scores, self.rows)
        return choice

    def append(self, tokens: list[int] | torch.Tensor) -> None:
        """Extend every row's history with its new token."""
        tokens = torch.as_tensor(tokens, dtype=torch.long).to(self.device)
        if len(tokens) != len(self.rows):
            raise ValueError(f"{len(tokens)} tokens for {len(self.rows)} rows")
        for row, token in zip(self.rows, tokens.tolist()):
            row.append(token)
        self.tensors.append(tokens)
        self._logprob_scores = None

    def history(self, position: int) -> list[int]:
        """Prompt + generated tokens of a row."""
        return self.rows[position].history


def _bans_tokens(row) -> bool:
    """Whether a row's processors can set scores to -inf or bias them (a grammar dead end is then possible)."""
    spec = row.spec
    p = spec.params
    return bool(spec.bad_word_ids or p.bad_word_tokens or p.logit_bias or row.ngrams or row.encoder_ngrams)
