"""Usage queries and reports: what the stores answer and the usage API returns."""

from __future__ import annotations

from typing import Literal

import msgspec

GroupBy = Literal["day", "model", "key", "team", "none"]
GROUP_BY_FIELDS: tuple[str, ...] = ("day", "model", "key", "team", "none")


class UsageQuery(msgspec.Struct, frozen=True):
    start: float  # unix seconds UTC, inclusive
    end: float  # unix seconds UTC, exclusive
    team_id: str | None = None  # None: every team (admin)
    group_by: GroupBy = "day"


class UsageRow(msgspec.Struct):
    key: str  # the day (YYYY-MM-DD), model, key id or team id; "" when not grouped
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
