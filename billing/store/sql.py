"""The little that differs between the SQL dialects the usage stores speak, and numbered parameters
(so a query's text can be assembled in any order)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class SqlDialect:
    name = ""

    def mark(self, n: int) -> str:
        raise NotImplementedError

    def floor_div(self, expr: str, size: int) -> str:
        """floor(expr / size) as an integer, exactly: the division rounds, so a time a hair before a
        bucket's edge can come out as the edge; the correction puts it back, as Python's `//` would."""
        raise NotImplementedError

    def greatest(self, a: str, b: str) -> str:
        raise NotImplementedError

    def one_of(self, column: str, values: Sequence[str], params: Params) -> str:
        raise NotImplementedError

    def contains(self, column: str, text: str, params: Params) -> str:
        """`column` holds `text` as a substring: exactly, case-sensitively, no character a wildcard."""
        raise NotImplementedError


class SqliteDialect(SqlDialect):
    name = "sqlite"

    def mark(self, n: int) -> str:
        return f"?{n}"

    def floor_div(self, expr: str, size: int) -> str:
        # SQLite's floor() exists only when it was built with its math functions; truncation is floor
        # for the non-negative values bucketed here (times after 1970-01-02)
        quotient = f"CAST(({expr}) / {size} AS INTEGER)"
        return f"({quotient} - (({expr}) < {quotient} * {size}))"

    def greatest(self, a: str, b: str) -> str:
        return f"max({a}, {b})"

    def one_of(self, column: str, values: Sequence[str], params: Params) -> str:
        return f"{column} IN ({', '.join(params(v) for v in values)})"

    def contains(self, column: str, text: str, params: Params) -> str:
        return f"instr({column}, {params(text)}) > 0"


class PostgresDialect(SqlDialect):
    name = "postgresql"

    def mark(self, n: int) -> str:
        return f"${n}"

    def floor_div(self, expr: str, size: int) -> str:
        quotient = f"floor(({expr}) / {size})"
        return f"({quotient}::bigint - (({expr}) < {quotient} * {size})::int)"

    def greatest(self, a: str, b: str) -> str:
        return f"GREATEST({a}, {b})"

    def one_of(self, column: str, values: Sequence[str], params: Params) -> str:
        return f"{column} = ANY({params(list(values))}::text[])"

    def contains(self, column: str, text: str, params: Params) -> str:
        return f"strpos({column}, {params(text)}::text) > 0"


class Params:
    """The values bound to one statement: `params(value)` appends it and returns its placeholder."""

    def __init__(self, dialect: SqlDialect) -> None:
        self.dialect = dialect
        self.values: list[Any] = []

    def __call__(self, value: Any) -> str:
        self.values.append(value)
        return self.dialect.mark(len(self.values))


def claim_alert_sql(dialect: SqlDialect) -> str:
    """Insert-once of a sent budget alert: a row back when this store recorded it, none when another had."""
    marks = ", ".join(dialect.mark(n) for n in range(1, 5))
    return (f"INSERT INTO budget_alerts (scope, period, threshold, sent_at) VALUES ({marks}) "
            "ON CONFLICT DO NOTHING RETURNING threshold")


def health_state_sql(dialect: SqlDialect) -> str:
    """Set a health alert's fleet-wide state (fired 1 / armed 0) as judged at a time: a row back only when this
    judgement changed it (a new row, or a change by a judgement later than the one that set it)."""
    marks = ", ".join(dialect.mark(n) for n in range(1, 5))
    return (f"INSERT INTO health_alert_states (scope, measure, fired, changed_at) VALUES ({marks}) "
            "ON CONFLICT (scope, measure) DO UPDATE SET fired = excluded.fired, changed_at = excluded.changed_at "
            "WHERE health_alert_states.fired <> excluded.fired "
            "AND health_alert_states.changed_at < excluded.changed_at RETURNING fired")
