"""What is limited: one subject (a key, a team) and its optional limits."""

from __future__ import annotations

import msgspec


class LimitScope(msgspec.Struct, frozen=True):
    """One limited subject, e.g. ``key:<id>`` or ``team:<id>``; every limit is optional (None = unlimited)."""

    id: str
    rpm: int | None = None
    tpm: int | None = None
    max_concurrency: int | None = None  # sequences in flight (prompts x candidates), not requests

    def slots(self, sequences: int) -> int:
        """Concurrency slots a request of `sequences` holds here: one per sequence, at most the whole cap (a
        request larger than the cap is admitted when nothing else of the scope runs, and then runs alone)."""
        return max(1, min(sequences, self.max_concurrency or 1))
