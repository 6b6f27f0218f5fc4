"""The little that differs between the SQL dialects the usage stores speak, and numbered parameters
(so a query's text can be assembled in any order)."""

from __future__ import annotations

from collections.abc import Sequence


class Dialect:
    name = ""

    def mark(self, n: int) -> str:
        raise NotImplementedError

    def floor_div(self, expr: str, size: int) -> str:
        """floor(expr / size) as an integer."""
        raise NotImplementedError

    def greatest(self, a: str, b: str) -> str:
        raise NotImplementedError

    def one_of(self, column: str, values: Sequence[str], params: Params) -> str:
        raise NotImplementedError


class SqliteDialect(Dialect):
    name = "sqlite"

    def mark(self, n: int) -> str:
        return f"?{n}"

    def floor_div(self, expr: str, size: int) -> str:
        # truncation is floor for the non-negative values bucketed here (times after 1970-01-02);
        # SQLite's floor() exists only when it was built with its math functions
        return f"CAST(({expr}) / {size} AS INTEGER)"

    def greatest(self, a: str, b: str) -> str:
        return f"max({a}, {b})"

    def one_of(self, column: str, values: Sequence[str], params: Params) -> str:
        return f"{column} IN ({', '.join(params(v) for v in values)})"


class PostgresDialect(Dialect):
    name = "postgresql"

    def mark(self, n: int) -> str:
        return f"${n}"

    def floor_div(self, expr: str, size: int) -> str:
        return f"floor(({expr}) / {size})::bigint"

    def greatest(self, a: str, b: str) -> str:
        return f"GREATEST({a}, {b})"

    def one_of(self, column: str, values: Sequence[str], params: Params) -> str:
        return f"{column} = ANY({params(list(values))}::text[])"


class Params:
    """The values bound to one statement: `params(value)` appends it and returns its placeholder."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self.values: list = []

    def __call__(self, value) -> str:
        self.values.append(value)
        return self.dialect.mark(len(self.values))
