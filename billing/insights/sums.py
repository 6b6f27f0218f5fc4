"""The sums every usage view shows, spelled once in SQL and once as a struct."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from billing.usage import UsageRow


class Sums(UsageRow):
    """A usage row plus how its requests ended."""

    ok: int = 0
    cancelled: int = 0
    errors: int = 0  # failed after reaching a worker, or a server fault
    rejected: int = 0  # refused before any token: invalid, over a limit, rate-limited
    rate_limited: int = 0  # answered 429 by a rate limit, a concurrency cap or a full queue (not a budget)
    budget_refused: int = 0  # refused by a budget (`records.BUDGET_REFUSED`: 429 or 402 by dialect)

    @classmethod
    def of(cls, key: str, values: Iterable[Any]) -> Sums:
        """From the columns of `Source.sums()`."""
        # PostgreSQL sums bigints as numeric (Decimal): int() is exact
        return cls(key, *(int(v or 0) for v in values))

    def add(self, other: Sums) -> None:  # type: ignore[override]  # sums add only to sums
        super().add(other)
        self.ok += other.ok
        self.cancelled += other.cancelled
        self.errors += other.errors
        self.rejected += other.rejected
        self.rate_limited += other.rate_limited
        self.budget_refused += other.budget_refused

    @property
    def error_rate(self) -> float:
        """Requests that got no answer (failed or rejected; cancelled ones were the client's choice)."""
        return (self.errors + self.rejected) / self.requests if self.requests else 0.0


def ranked(groups: Iterable[Sums]) -> list[Sums]:
    """Biggest first: by cost, then requests, then key (a stable order for equal groups)."""
    return sorted(groups, key=lambda s: (-s.cost_micros, -s.requests, s.key))
