"""`usage_hourly_latency` (schema 11): per team, UTC hour and model, a histogram of latency and of time to first
token over fixed log-spaced buckets, and the streamed requests' completion tokens and their ms after the first
token; kept by the writer in the transaction that inserts the records, as the other rollups (rollups.py).

What percentiles need, in sums: the percentiles of any set of hours (and models) come from their histograms added
up, so a 90-day view reads a few thousand rows instead of every record (billing/insights/histograms.py). A
histogram's percentile is its bucket's geometric middle: the bucket holds the true nearest-rank value, so the
estimate is within RELATIVE_ERROR of it for values from 1 ms to the last edge (~70 min); below 1 ms it is 0.5 ms
(within 0.5 ms), above the last edge it is that edge. Rejected requests are left out, as the exact percentiles
leave them out (a refusal's latency is the gateway's, not a generation's).

The buckets are columns (`lat_0`..., `ttft_0`...), not rows: a bucket's count adds up on conflict like any other
sum, SQL adds them across hours and models, and a row of zeros costs SQLite a byte per column.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from typing import Any

from billing.records import LedgerEntry
from billing.store.base import TABLE
from billing.store.rollups import upsert_sql
from storage.sql_dialect import SqlDialect

LATENCY = "usage_hourly_latency"
HOUR = 3600
RATIO = 1.1  # each bucket's upper edge over its lower edge
# edges as short decimals, so Python's float() and every database's parser read each one as the same double
EDGES: tuple[float, ...] = tuple(float(f"{RATIO ** i:.6g}") for i in range(161))  # 1 ms .. ~4.2e6 ms (~70 min)
BUCKETS = len(EDGES) + 1  # [0, 1 ms), one per pair of edges, [last edge, inf)
RELATIVE_ERROR = max(math.sqrt(b / a) for a, b in zip(EDGES, EDGES[1:], strict=False)) - 1  # ~4.9 %
MEASURES = (("latency_ms", "lat"), ("ttft_ms", "ttft"))  # (records' column, this table's column prefix)
KEY = ("team_id", "period", "model")
STREAMED = "status = 'ok' AND ttft_ms IS NOT NULL AND latency_ms > ttft_ms"  # requests with a generation time
BUCKET_COLUMNS = tuple(f"{prefix}_{i}" for _, prefix in MEASURES for i in range(BUCKETS))
# (column, its backfill from the subquery's lb / tb bucket indexes): upsert_sql adds these on conflict
SUMS = (("streamed_tokens", "SUM(st)"), ("streamed_ms", "SUM(sm)"),
        *((f"{prefix}_{i}", f"SUM(CASE WHEN {prefix[0]}b = {i} THEN 1 ELSE 0 END)")
          for _, prefix in MEASURES for i in range(BUCKETS)))


def bucket(value: float) -> int:
    """The bucket a value falls in (the SQL of `bucket_sql` agrees)."""
    return bisect_right(EDGES, value)


def middle(index: int) -> float:
    """What a bucket stands for: its edges' geometric middle (0.5 ms below 1 ms; the last edge above it)."""
    if index == 0:
        return EDGES[0] / 2
    if index >= len(EDGES):
        return EDGES[-1]
    return math.sqrt(EDGES[index - 1] * EDGES[index])


def bucket_sql(column: str, lo: int = 0, hi: int = len(EDGES)) -> str:
    """`bucket(column)` in SQL: a binary search over the edges as nested CASEs (8 comparisons a row), since SQLite
    may lack log()."""
    if lo == hi:
        return str(lo)
    mid = (lo + hi) // 2
    return (f"CASE WHEN {column} < {EDGES[mid]!r} THEN {bucket_sql(column, lo, mid)} "
            f"ELSE {bucket_sql(column, mid + 1, hi)} END")


def table_sql(integer: str, real: str, without_rowid: str = "") -> str:
    columns = ["team_id TEXT NOT NULL", f"period {integer} NOT NULL", "model TEXT NOT NULL",
               f"streamed_tokens {integer} NOT NULL", f"streamed_ms {real} NOT NULL",
               *(f"{c} INTEGER NOT NULL DEFAULT 0" for c in BUCKET_COLUMNS)]
    return f"CREATE TABLE {LATENCY} ({', '.join(columns)}, PRIMARY KEY ({', '.join(KEY)})){without_rowid}"


def backfill_sql(dialect: SqlDialect) -> str:
    """Fills the table from the records already stored (the migration; a bulk load)."""
    inner = (f"SELECT team_id, {dialect.floor_div('time', HOUR)} * {HOUR} AS p, model, "
             f"{bucket_sql('latency_ms')} AS lb, CASE WHEN ttft_ms IS NULL THEN -1 ELSE {bucket_sql('ttft_ms')} END "
             f"AS tb, CASE WHEN {STREAMED} THEN completion_tokens ELSE 0 END AS st, "
             f"CASE WHEN {STREAMED} THEN latency_ms - ttft_ms ELSE 0 END AS sm "
             f"FROM {TABLE} WHERE status <> 'rejected'")
    return (f"INSERT INTO {LATENCY} ({', '.join(KEY)}, {', '.join(c for c, _ in SUMS)}) "
            f"SELECT team_id, p, model, {', '.join(expr for _, expr in SUMS)} FROM ({inner}) AS binned "
            "GROUP BY team_id, p, model")


def migration(dialect: SqlDialect, integer: str, real: str, without_rowid: str = "") -> list[str]:
    return [table_sql(integer, real, without_rowid), backfill_sql(dialect)]


def upsert(dialect: SqlDialect, *, arrays: dict[str, str] | None = None) -> str:
    """The upsert adding one increment row (or, with `arrays`, every row in one statement: rollups.upsert_sql)."""
    return upsert_sql(dialect, LATENCY, KEY, SUMS, arrays=arrays)


def latency_rows(entries: list[LedgerEntry]) -> list[tuple[Any, ...]]:
    """The table's increments for newly stored entries, sorted by key (writers lock rows in one order)."""
    groups: dict[tuple[str, int, str], list[Any]] = {}
    for e in entries:
        u = e.usage
        if u.status == "rejected":
            continue
        key = (u.team_id, int(u.time // HOUR) * HOUR, u.model)
        row = groups.get(key)
        if row is None:
            row = groups[key] = [0, 0.0, *([0] * (2 * BUCKETS))]
        if u.status == "ok" and u.ttft_ms is not None and u.latency_ms > u.ttft_ms:
            row[0] += u.completion_tokens
            row[1] += u.latency_ms - u.ttft_ms
        row[2 + bucket(u.latency_ms)] += 1
        if u.ttft_ms is not None:
            row[2 + BUCKETS + bucket(u.ttft_ms)] += 1
    return [(*k, *v) for k, v in sorted(groups.items())]
