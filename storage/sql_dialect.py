"""The SQL functions that SQLite and PostgreSQL spell differently, for the statements a store assembles (billing's
usage queries, its rollups), and `Params`, which numbers a statement's parameters. Parameters and row locks are
translated apart, for every statement (storage/sql_text.py); `Database.sql` is the dialect of a handle's database.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class SqlDialect:
    name = ""
    # percentile_disc(...) WITHIN GROUP: without them a caller sorts the values itself (SQLite)
    ordered_set_aggregates = False

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
    ordered_set_aggregates = True

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
    """The values bound to one statement: `params(value)` appends it and returns its numbered parameter (`?N`, the
    stores' one spelling: storage/sql_text.py), so a statement's text can be assembled in any order."""

    def __init__(self, dialect: SqlDialect) -> None:
        self.dialect = dialect
        self.values: list[Any] = []

    def __call__(self, value: Any) -> str:
        self.values.append(value)
        return f"?{len(self.values)}"
