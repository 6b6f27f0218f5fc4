"""Per-row grammar state: where the row's output is in its grammar."""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker.decoding.grammar.compiler import Grammar

if TYPE_CHECKING:  # imported where used: a worker that serves no structured output never loads it (~21 MB)
    import xgrammar as xgr


class GrammarState:
    def __init__(self, grammar: Grammar, stop_ids: list[int] | tuple[int, ...] | None = None,
                 matcher: xgr.GrammarMatcher | None = None):
        self.grammar = grammar
        self.stop_ids = list(stop_ids or grammar.stop_ids)
        import xgrammar as xgr

        self.matcher = matcher or xgr.GrammarMatcher(grammar.compiled, override_stop_tokens=self.stop_ids)
        self.failed = False  # a token the grammar refused got in (should not happen: the mask prevents it)

    def advance(self, token: int) -> None:
        if self.failed or self.matcher.is_terminated():
            return
        if not self.matcher.accept_token(token):
            self.failed = True

    @property
    def terminated(self) -> bool:
        """The grammar accepted and its end token was emitted: the row is done."""
        return self.matcher.is_terminated()

    @property
    def accepted(self) -> bool:
        """The output so far is a complete sentence of the grammar."""
        return not self.failed and (self.matcher.is_terminated() or self.matcher.is_completed())

    def fork(self) -> GrammarState:
        twin = GrammarState(self.grammar, self.stop_ids, self.matcher.fork())
        twin.failed = self.failed
        return twin
