"""Exact latency percentiles over a view's rows, nearest-rank: the p-th percentile of n values is
the ceil(p * n)-th smallest, a value that really occurred (PostgreSQL's percentile_disc). Exact,
because histogram buckets would bend the number by their width; on a team's 90 days the sort this
takes costs tens of milliseconds (bench/dashboard.py)."""

from __future__ import annotations

import math

import msgspec

from billing.filters import Selection, where
from billing.store.base import TABLE, UsageStore
from storage.sql_dialect import Params

FRACTIONS = (0.5, 0.95, 0.99)
MEASURED = ("latency_ms", "ttft_ms")


class Percentiles(msgspec.Struct):
    samples: int  # requests with a value
    p50: float | None = None  # None without samples
    p95: float | None = None
    p99: float | None = None

    @classmethod
    def of(cls, values: list[float]) -> Percentiles:
        """Of unsorted values (None values skipped)."""
        return cls.ranked(sorted(v for v in values if v is not None))

    @classmethod
    def ranked(cls, ordered: list[float]) -> Percentiles:
        """Of values sorted ascending."""
        n = len(ordered)  # the nearest rank's index
        return cls(n, *[ordered[max(math.ceil(f * n), 1) - 1] for f in FRACTIONS]) if n else cls(0)


async def percentiles(store: UsageStore, selection: Selection) -> dict[str, Percentiles]:
    """p50, p95 and p99 of latency and time to first token, over the view's requests that reached a
    worker (a rejection's latency is the gateway's refusal, not a generation's)."""
    params = Params(store.dialect)
    condition = f"{where(selection, params)} AND status <> 'rejected'"
    if store.dialect.ordered_set_aggregates:
        wanted = "ARRAY[" + ", ".join(str(f) for f in FRACTIONS) + "]::float8[]"
        select = ", ".join(f"COUNT({c}), percentile_disc({wanted}) WITHIN GROUP (ORDER BY {c})" for c in MEASURED)
        (row,) = await store.fetch(f"SELECT {select} FROM {TABLE} WHERE {condition}", params.values)
        out = {}
        for i, column in enumerate(MEASURED):
            count, values = int(row[2 * i]), row[2 * i + 1]
            out[column] = Percentiles(count, *values) if count else Percentiles(0)
        return out
    # SQLite has no ordered-set aggregates: one pass fetches both columns, Python sorts them
    rows = await store.fetch(f"SELECT {', '.join(MEASURED)} FROM {TABLE} WHERE {condition}", params.values)
    return {column: Percentiles.of([r[i] for r in rows]) for i, column in enumerate(MEASURED)}
