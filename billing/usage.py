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

    def add(self, other: UsageRow) -> None:
        self.requests += other.requests
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.compute_tokens += other.compute_tokens
        self.cost_micros += other.cost_micros


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
