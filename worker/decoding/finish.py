"""Per-row stop decisions on token ids: EOS, stop token ids, length limits."""

from __future__ import annotations

from common.protocol import FinishReason
from worker.decoding.grammar import GrammarState
from worker.decoding.rows import RowSpec


def finish_reason(
    spec: RowSpec, token_id: int, output_len: int, max_context: int | None = None,
    grammar: GrammarState | None = None,
) -> tuple[FinishReason, int | None] | None:
    """Why the row ends after emitting `token_id` as its `output_len`-th token, or None to go on.

    Returns (reason, matched stop token id or None). EOS ids are `spec.eos_token_ids` (empty when
    ignore_eos); they and stop_token_ids are already masked below min_tokens, so they cannot show up
    early. An end token wins over a length limit reached on the same token.

    `grammar` is the row's constraint state after `token_id`: a terminated grammar (it accepted and
    its end token was emitted, also under ignore_eos) ends the row as an EOS would; a grammar that
    refused the token ends it with "error" rather than let an invalid output go on.
    """
    params = spec.params
    if grammar is not None:
        if grammar.failed:
            return "error", None
        if grammar.terminated:
            return "eos_token", None
    if token_id in spec.eos_token_ids:
        return "eos_token", None
    if token_id in params.stop_token_ids:
        return "stop_token", token_id
    total = len(spec.prompt_ids) + output_len
    if params.max_tokens is not None and output_len >= params.max_tokens:
        return "length", None
    if params.max_total_tokens is not None and total >= params.max_total_tokens:
        return "length", None
    if max_context is not None and total >= max_context:
        return "length", None
    return None
