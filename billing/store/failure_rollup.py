"""`usage_hourly_failures` (schema 11): per team, UTC hour, model, status ('error' or 'rejected') and HTTP error
status (0: none recorded), how many requests failed; kept by the writer in the transaction that inserts the records,
as the other rollups (rollups.py). The overview's failures by status over buckets of whole hours that are not
whole days (a long hourly view in steps, an hourly view) read it instead of every record of the window."""

from __future__ import annotations

from typing import Any

from billing.records import LedgerEntry
from billing.store.base import TABLE
from billing.store.rollups import upsert_sql
from storage.sql_dialect import SqlDialect

FAILURES = "usage_hourly_failures"
HOUR = 3600
FAILED = ("error", "rejected")
KEY = ("team_id", "period", "model", "status", "error_status")
SUMS = (("requests", "COUNT(*)"),)


def migration(dialect: SqlDialect, integer: str, without_rowid: str = "") -> list[str]:
    """The table, filled from the records already stored."""
    failed = "', '".join(FAILED)
    return [f"CREATE TABLE {FAILURES} (team_id TEXT NOT NULL, period {integer} NOT NULL, model TEXT NOT NULL, "
            f"status TEXT NOT NULL, error_status INTEGER NOT NULL, requests {integer} NOT NULL, "
            f"PRIMARY KEY ({', '.join(KEY)})){without_rowid}",
            f"INSERT INTO {FAILURES} ({', '.join(KEY)}, requests) "
            f"SELECT team_id, {dialect.floor_div('time', HOUR)} * {HOUR}, model, status, COALESCE(error_status, 0), "
            f"COUNT(*) FROM {TABLE} WHERE status IN ('{failed}') GROUP BY 1, 2, 3, 4, 5"]


def upsert(dialect: SqlDialect, *, arrays: dict[str, str] | None = None) -> str:
    return upsert_sql(dialect, FAILURES, KEY, SUMS, arrays=arrays)


def failure_rows(entries: list[LedgerEntry]) -> list[tuple[Any, ...]]:
    """The table's increments for newly stored entries, sorted by key (writers lock rows in one order)."""
    counts: dict[tuple[Any, ...], int] = {}
    for e in entries:
        u = e.usage
        if u.status in FAILED:
            key = (u.team_id, int(u.time // HOUR) * HOUR, u.model, u.status, u.error_status or 0)
            counts[key] = counts.get(key, 0) + 1
    return [(*k, n) for k, n in sorted(counts.items())]
