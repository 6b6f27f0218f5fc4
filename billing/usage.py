"""Usage queries and reports: what the usage API asks the ledger and returns."""

from __future__ import annotations

from typing import Literal

import msgspec

from billing.filters import Filters, Selection

GroupBy = Literal["day", "hour", "model", "key", "user", "team", "dialect", "status", "adapter", "none"]
GROUP_BY_FIELDS: tuple[str, ...] = ("day", "hour", "model", "key", "user", "team", "dialect", "status", "adapter",
                                     "none")


class UsageQuery(msgspec.Struct, frozen=True):
    start: float  # unix seconds UTC, inclusive
    end: float  # unix seconds UTC, exclusive
    team_id: str | None = None  # None: every team (admin)
    group_by: GroupBy = "day"
    filters: Filters = Filters()
    tz: str = "UTC"  # the clock whose days and hours `day` and `hour` group by

    @property
    def selection(self) -> Selection:
        return Selection(self.start, self.end, self.team_id, self.filters)


class UsageRow(msgspec.Struct):
    key: str  # the day (YYYY-MM-DD), hour, model, key id, user id or adapter ("-" for none), ...; "" when not grouped
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    compute_tokens: int = 0
    cost_micros: int = 0
    # schema 8: prompt tokens from the prefix cache, batch lines and what they cost (within cost_micros), and what
    # the cached-input price and the batch discount saved against the list prices (cost + both = the list cost)
    cached_tokens: int = 0
    batch_requests: int = 0
    batch_cost_micros: int = 0
    cache_saved_micros: int = 0
    batch_saved_micros: int = 0

    def add(self, other: UsageRow) -> None:
        for name in _SUMMED:
            setattr(self, name, getattr(self, name) + getattr(other, name))


_SUMMED = UsageRow.__struct_fields__[1:]


class UsageReport(msgspec.Struct):
    rows: list[UsageRow]
    totals: UsageRow

    @classmethod
    def from_rows(cls, rows: list[UsageRow]) -> UsageReport:
        totals = UsageRow(key="total")
        for row in rows:
            totals.add(row)
        return cls(rows=rows, totals=totals)


def micros_to_decimal(micros: int) -> str:
    """12345678 -> "12.345678": exact, for humans reading an invoice."""
    sign = "-" if micros < 0 else ""
    whole, frac = divmod(abs(micros), 1_000_000)
    return f"{sign}{whole}.{frac:06d}"
