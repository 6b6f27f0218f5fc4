"""How many tokens a request reserves at admission. The gateway computes it; the rule lives here so that
every dialect reserves the same way.

reserve = prompt tokens + max new tokens x sequences that cost compute, where sequences is
``num_beams`` under beam search (every beam decodes, whatever n returns), else ``max(n, best_of)``
(best_of candidates are all generated even if only n come back). The prompt counts once: the sequences
share it. Settle with what was actually processed: prompt + completion tokens of all sequences.
"""

from __future__ import annotations


def reservation_tokens(prompt_tokens: int, max_new_tokens: int, *, n: int = 1, best_of: int | None = None,
                       num_beams: int = 1) -> int:
    sequences = num_beams if num_beams > 1 else max(n, best_of or 1)
    return prompt_tokens + max_new_tokens * sequences
