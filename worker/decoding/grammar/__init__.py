"""Structured output: constraints (JSON schema, JSON object, regex, EBNF) compiled by xgrammar and applied
as a per-row token mask inside the decoding batch."""

from worker.decoding.grammar.compiler import (
    Grammar,
    GrammarBusy,
    GrammarCompiler,
    GrammarError,
    GrammarPending,
    GrammarTimeout,
)
from worker.decoding.grammar.mask import GrammarMasker
from worker.decoding.grammar.matcher import GrammarState

__all__ = ["Grammar", "GrammarBusy", "GrammarCompiler", "GrammarError", "GrammarMasker", "GrammarPending",
           "GrammarState", "GrammarTimeout"]
