"""Speculative decoding in the decode step: which rows draft how many tokens, and the check of each draft token.

A row with drafts d1..dk feeds its input token and then d1..dk at the positions after it, in the step's one
forward (runner.decode_with_drafts; without the native forward, the drafts run as a chunk of their own after the
decode forward). The logits at the input's position give the row's token as in any step. While the token chosen
equals the next draft, the logits at that draft's position are valid (every token before it is the row's own),
and the next token is chosen from them, through the same logits pipeline as a step of its own (penalties, bans,
grammar, logprobs see the history they would have seen). So the tokens are those decoding one at a time gives:
greedy identical; sampled, each position draws from the row's own generator exactly as it would have, and a draft
is accepted when the draw equals it, which is the rejection rule for a point-mass proposal (accept t with
probability p(t); otherwise a draw from p without t, renormalised) and keeps the seeded tokens too. The KV cache
holds the positions of the tokens kept; the rest lie past the row's length, never attended, overwritten later.
"""

from __future__ import annotations

from worker.engine.drafts import STEP_TOKENS, Drafter
from worker.engine.sequence import RequestState, Sequence


def new_drafter(state: RequestState, prompt_lookup: bool) -> Drafter | None:
    """A candidate row's drafter, or None where it never drafts: beams (each step ranks every beam's tokens
    against the others: a beam cannot run ahead of its search), rows that return hidden states (one per step's
    forward), prompts given as embeddings (their ids are placeholders)."""
    prepared = state.prepared
    params = prepared.request.params
    if (params.num_beams > 1 or params.return_hidden_states or prepared.prompt_embeds is not None
            or not (prompt_lookup or prepared.prediction_ids)):
        return None
    return Drafter(prepared.prompt_ids, prepared.prediction_ids, lookup=prompt_lookup)


def plan_drafts(rows: list[Sequence], capacity: int, vocab_size: int) -> dict[int, list[int]]:
    """{row position: its draft tokens} for this step, rows without any left out. A draft stays inside what the
    cache holds now (no growth inside a step), what the row may still generate, the vocabulary, and the step's
    STEP_TOKENS (drafts.py: a full batch drafts nothing)."""
    tokens = len(rows)
    drafts: dict[int, list[int]] = {}
    for position, row in enumerate(rows):
        if tokens >= STEP_TOKENS:
            break
        drafter = row.drafter
        if drafter is None or row.finish or row.request.done:
            continue
        if not row.output_ids and row.request.last_embed is not None:  # its first input is an embedding
            continue
        room = min(row.request.prepared.max_new_tokens - len(row.output_ids) - 1, capacity - row.length - 1,
                   STEP_TOKENS - tokens)
        draft = drafter.propose(row.output_ids, tokens, room)
        usable = next((index for index, token in enumerate(draft) if not 0 <= token < vocab_size), len(draft))
        if usable:
            drafts[position] = draft[:usable]
            tokens += usable  # later rows weigh their drafts against the step as it grows
        else:
            drafter.last_source = ""
    return drafts
