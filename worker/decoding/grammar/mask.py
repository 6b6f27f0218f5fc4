"""Apply the allowed-token masks of the constrained rows to a step's scores, in place.

One bitmask buffer for the batch; every constrained row's matcher fills its own line (xgrammar's
batch filler, threaded), then one kernel call sets the disallowed scores of those rows to -inf.
"""

from __future__ import annotations

import torch

from worker.decoding.grammar.matcher import GrammarState

# xgrammar is imported where it is used: a worker that serves no structured output never loads it (~21 MB)


class GrammarMasker:
    def __init__(self, vocab_size: int):
        import xgrammar as xgr

        self.vocab_size = vocab_size
        self._bitmask: torch.Tensor | None = None
        self._batcher = xgr.BatchGrammarMatcher()

    def apply(self, scores: torch.Tensor, raw: torch.Tensor, states: list[GrammarState], rows: list[int],
              banning: list[int] | None = None) -> None:
        """Mask rows `rows` of `scores` ([B, V] float32) with the grammars `states` (same order).

        A row whose processors (bad words, bias) banned every token its grammar allows would have no
        finite score left; it falls back to its raw logits under the grammar mask, so the output stays
        valid rather than following a ban into an invalid token. Only `banning` rows (those with bans or
        biases) can get there, so only they are checked.
        """
        if not rows:
            return
        import xgrammar as xgr

        bitmask = self._buffer(scores.shape[0])
        matchers = [s.matcher for s in states]
        if len(matchers) == 1:
            matchers[0].fill_next_token_bitmask(bitmask, rows[0])
        else:
            self._batcher.batch_fill_next_token_bitmask(matchers, bitmask, indices=rows)
        xgr.apply_token_bitmask_inplace(scores, bitmask, vocab_size=self.vocab_size, indices=rows)
        if not banning:
            return
        index = torch.tensor(banning, device=scores.device)
        dead = torch.isneginf(scores.index_select(0, index)).all(dim=-1)
        if bool(dead.any()):
            stuck = [r for r, d in zip(banning, dead.tolist()) if d]
            scores[stuck] = raw[stuck].to(device=scores.device, dtype=scores.dtype)
            xgr.apply_token_bitmask_inplace(scores, bitmask, vocab_size=self.vocab_size, indices=stuck)

    def _buffer(self, batch: int) -> torch.Tensor:
        import xgrammar as xgr

        # exactly one line per batch row: xgrammar's CPU kernel takes a slow path when the shapes differ
        if self._bitmask is None or self._bitmask.shape[0] != batch:
            self._bitmask = xgr.allocate_token_bitmask(batch, self.vocab_size)
        return self._bitmask
