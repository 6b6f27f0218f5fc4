"""The usage API's grouped sums (`GET /v1/usage`, `/admin/usage`)."""

from __future__ import annotations

from billing.filters import NO_USER, Selection
from billing.insights.sources import Source, fetch_parts, for_buckets, for_totals
from billing.store.base import UsageStore
from billing.timebuckets import Bucketing
from billing.usage import UsageQuery, UsageReport, UsageRow
from storage.sql_dialect import Params

# group_by -> column; a fixed whitelist, never user text in SQL
GROUP_COLUMNS = {"model": "model", "key": "key_id", "user": "user_id", "team": "team_id", "dialect": "dialect",
                 "status": "status", "adapter": "adapter", "none": "''"}


def group_key(value: object) -> str:
    """A group's key as the API shows it: requests without a user (NULL in the records, '' in the
    rollups) or without an adapter ('') are NO_USER, the `-` that selects them in a filter."""
    return NO_USER if value is None or value == "" else str(value)


async def usage_report(store: UsageStore, query: UsageQuery) -> UsageReport:
    selection = query.selection
    rows: dict[str, UsageRow] = {}
    if query.group_by in ("day", "hour"):
        bucketing = Bucketing(query.group_by, query.tz, query.start, query.end)
        starts: dict[str, float] = {}

        def statement(source: Source, part: Selection, params: Params) -> str:
            key, span = bucketing.sql(store.dialect, source.time_column)
            return (f"SELECT {key} AS k, {span} AS s, {source.row_sums()} FROM {source.table} "
                    f"WHERE {source.where(part, params)} GROUP BY k, s")

        for k, s, *values in await fetch_parts(store, for_buckets(selection, bucketing), statement):
            bucket = bucketing.bucket(k, s)
            starts[bucket.label] = bucket.start
            # a day that a DST change cut in two spans, or a rollup and an edge, fold into one row
            rows.setdefault(bucket.label, UsageRow(bucket.label)).add(UsageRow(bucket.label, *map(int, values)))
        return UsageReport.from_rows(sorted(rows.values(), key=lambda r: starts[r.key]))
    column = GROUP_COLUMNS[query.group_by]

    def grouped(source: Source, part: Selection, params: Params) -> str:
        return (f"SELECT {column} AS g, {source.row_sums()} FROM {source.table} "
                f"WHERE {source.where(part, params)} GROUP BY g")

    for g, *values in await fetch_parts(store, for_totals(selection), grouped):
        key = group_key(g) if query.group_by != "none" else ""
        rows.setdefault(key, UsageRow(key)).add(UsageRow(key, *map(int, values)))
    # sorted here, not in SQL: PostgreSQL's collation would order differently from SQLite's bytes
    return UsageReport.from_rows(sorted(rows.values(), key=lambda r: r.key))
